//! Typed columns from JSON values: a declared or inferred list of
//! `field → type`, and the check that one record's value fits it.
//!
//! A value fits when it is a JSON object whose fields named in the schema
//! have the declared type (or are `null` / absent: every typed column is
//! nullable). Fields the schema does not name are kept, as a JSON object,
//! in the `_extra` column — never dropped (the "rescued data" idea of
//! lakehouse loaders). A value that is not a JSON object, or a field of
//! the wrong type, does not fit: the caller sends the record to the
//! `_rejected` output with the reason.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Names of the fixed columns every table has; a JSON field may not take one.
pub const FIXED_COLUMNS: [&str; 7] = [
    "offset",
    "timestamp",
    "key",
    "headers",
    "value",
    "_extra",
    "_reason",
];

/// The Hive partition key of the lakehouse writer's files (`date=…/`): a
/// reader with Hive partitioning puts the partition's value in place of a
/// column of that name (a trial saw it), so no typed column takes it.
pub const PARTITION_COLUMN: &str = "date";

/// Names no typed column may take: [`FIXED_COLUMNS`] and
/// [`PARTITION_COLUMN`], compared without regard to letter case, as DuckDB
/// and Spark compare column names.
fn reserved_names() -> impl Iterator<Item = &'static str> {
    FIXED_COLUMNS.into_iter().chain([PARTITION_COLUMN])
}

/// Whether `name` is a reserved name ([`reserved_names`]), in any letter
/// case.
fn reserved(name: &str) -> bool {
    reserved_names().any(|r| r.eq_ignore_ascii_case(name))
}

/// Earliest timestamp a `timestamp` column takes, ms since the Unix epoch
/// (0001-01-01T00:00:00Z): readers fail on a file holding dates outside
/// years 1 to 9999 (DuckDB's conversion, Python's `datetime`).
pub const MIN_TIMESTAMP_MS: i64 = -62_135_596_800_000;
/// Latest timestamp a `timestamp` column takes (9999-12-31T23:59:59.999Z).
pub const MAX_TIMESTAMP_MS: i64 = 253_402_300_799_999;

/// How many values [`JsonColumns::infer`] looks at by default.
pub const DEFAULT_INFER_ROWS: usize = 1000;

/// The type of one typed column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// JSON `true`/`false` → Parquet BOOLEAN.
    Bool,
    /// A JSON integer that fits i64 → INT64.
    Int64,
    /// Any JSON number → DOUBLE.
    Double,
    /// A JSON string → UTF-8 string.
    String,
    /// An RFC 3339 string or an integer of ms since the Unix epoch →
    /// timestamp (ms, UTC).
    Timestamp,
    /// Any JSON value, stored as its JSON text (UTF-8 string).
    Json,
}

impl ColumnType {
    /// The canonical name (`bool`, `int64`, `double`, `string`,
    /// `timestamp`, `json`).
    pub fn as_str(self) -> &'static str {
        match self {
            ColumnType::Bool => "bool",
            ColumnType::Int64 => "int64",
            ColumnType::Double => "double",
            ColumnType::String => "string",
            ColumnType::Timestamp => "timestamp",
            ColumnType::Json => "json",
        }
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ColumnType {
    type Err = SchemaError;

    /// Accepts the canonical names and the usual aliases (`boolean`,
    /// `int`/`i64`/`long`, `float`/`float64`/`f64`, `str`/`utf8`,
    /// `timestamp_ms`).
    fn from_str(s: &str) -> Result<ColumnType, SchemaError> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "bool" | "boolean" => ColumnType::Bool,
            "int64" | "int" | "i64" | "long" | "integer" => ColumnType::Int64,
            "double" | "float" | "float64" | "f64" => ColumnType::Double,
            "string" | "str" | "utf8" | "text" => ColumnType::String,
            "timestamp" | "timestamp_ms" => ColumnType::Timestamp,
            "json" => ColumnType::Json,
            other => {
                return Err(SchemaError::UnknownType {
                    ty: other.to_owned(),
                });
            }
        })
    }
}

/// One typed column.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Column {
    /// Column name (the JSON field's name, or `value_{name}` when an
    /// inferred field collides with a fixed column; an inferred name taken
    /// by an earlier column gets `_2`, `_3`, ...).
    pub name: String,
    /// The JSON field it reads.
    pub field: String,
    /// Its type.
    #[serde(rename = "type")]
    pub ty: ColumnType,
}

/// Errors of declaring or inferring a schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A type name that is not one of [`ColumnType`]'s.
    #[error("unknown column type `{ty}` (expected bool, int64, double, string, timestamp or json)")]
    UnknownType {
        /// The name given.
        ty: String,
    },
    /// A declared field with no name: no column can be named after it.
    #[error("a declared field has an empty name")]
    EmptyName,
    /// A declared field whose name is reserved: a fixed column's or
    /// [`PARTITION_COLUMN`].
    #[error("field `{field}` has a reserved column name ({}, in any letter case)", reserved_names().collect::<Vec<_>>().join(", "))]
    Collision {
        /// The field.
        field: String,
    },
    /// Two declared fields whose names differ only in letter case: DuckDB
    /// and Spark read them as one column name.
    #[error(
        "fields `{field}` and `{other}` differ only in letter case, which DuckDB and Spark read as one column name: declare one of them"
    )]
    CaseCollision {
        /// The later field.
        field: String,
        /// The earlier one.
        other: String,
    },
    /// A field declared twice.
    #[error("field `{field}` is declared twice")]
    Duplicate {
        /// The field.
        field: String,
    },
    /// A `field:type` list that does not parse.
    #[error("column list `{spec}`: {reason}")]
    Spec {
        /// The list given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// Inference met a value that is not a JSON object.
    #[error("cannot infer columns: the value at offset {offset} is not a JSON object ({reason})")]
    NotObject {
        /// Its offset.
        offset: u64,
        /// What it is instead.
        reason: String,
    },
    /// Inference saw no value at all, or no field.
    #[error("cannot infer columns: {0}")]
    Nothing(String),
}

/// Why one record's value does not fit the schema (the row goes to
/// `_rejected`, or an export stops, naming the offset).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("offset {offset}: {reason}")]
pub struct RowError {
    /// The record's offset.
    pub offset: u64,
    /// What does not fit.
    pub reason: String,
}

/// One typed cell of a fitted row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Absent or `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A number.
    Double(f64),
    /// A string (also a `json` column's text).
    Str(String),
    /// A timestamp, ms since the Unix epoch.
    Timestamp(i64),
}

/// A fitted value: one cell per column, in column order, and the fields
/// the schema does not name (a JSON object's text), if any.
#[derive(Debug, Clone, PartialEq)]
pub struct FittedRow {
    /// Cells in [`JsonColumns::columns`] order.
    pub cells: Vec<Cell>,
    /// `_extra`: the other fields, as a JSON object.
    pub extra: Option<String>,
}

/// An ordered list of typed columns read from JSON object values.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JsonColumns {
    columns: Vec<Column>,
}

impl JsonColumns {
    /// Declared columns, `field → type`, in the order given.
    ///
    /// # Errors
    /// [`SchemaError`] for an unknown type, a duplicate field, a field
    /// named like a fixed column, or an empty list.
    pub fn declared<'a>(
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<JsonColumns, SchemaError> {
        let mut columns: Vec<Column> = Vec::new();
        for (field, ty) in fields {
            let field = field.trim();
            if field.is_empty() {
                return Err(SchemaError::EmptyName);
            }
            if reserved(field) {
                return Err(SchemaError::Collision {
                    field: field.to_owned(),
                });
            }
            if columns.iter().any(|c| c.field == field) {
                return Err(SchemaError::Duplicate {
                    field: field.to_owned(),
                });
            }
            if let Some(other) = columns.iter().find(|c| same_name(&c.field, field)) {
                return Err(SchemaError::CaseCollision {
                    field: field.to_owned(),
                    other: other.field.clone(),
                });
            }
            columns.push(Column {
                name: field.to_owned(),
                field: field.to_owned(),
                ty: ty.parse()?,
            });
        }
        if columns.is_empty() {
            return Err(SchemaError::Nothing("no column declared".into()));
        }
        Ok(JsonColumns { columns })
    }

    /// Parses `field:type,field:type` (the `--json-columns` form).
    ///
    /// # Errors
    /// [`SchemaError::Spec`] for an entry without `:`, else as
    /// [`JsonColumns::declared`].
    pub fn parse_list(spec: &str) -> Result<JsonColumns, SchemaError> {
        let mut pairs = Vec::new();
        for entry in spec.split(',').filter(|e| !e.trim().is_empty()) {
            let (field, ty) = entry.split_once(':').ok_or_else(|| SchemaError::Spec {
                spec: spec.to_owned(),
                reason: format!("`{entry}` is not `field:type`"),
            })?;
            if field.trim().is_empty() {
                return Err(SchemaError::Spec {
                    spec: spec.to_owned(),
                    reason: format!("`{entry}` has an empty field name"),
                });
            }
            pairs.push((field, ty));
        }
        JsonColumns::declared(pairs)
    }

    /// Infers columns from `values` (offset, value bytes), which must all be
    /// JSON objects: one column per field seen, ordered by field name (byte
    /// order, so the same values always give the same columns); a field's type is
    /// `int64` if every non-null value is an integer, `double` if they are
    /// numbers, `bool`/`string` if all are, and `json` otherwise (objects,
    /// arrays, mixed kinds). A field seen only as `null` is a `string`.
    ///
    /// Column names are distinct: a field named like a fixed column is
    /// `value_{field}` (a field named `""` is `value_`), and a name an earlier column already has gets the
    /// first free `_2`, `_3`, ... (`{"offset", "value_offset"}` gives
    /// `value_offset` and `value_offset_2`).
    ///
    /// # Errors
    /// [`SchemaError::NotObject`] naming the first value that is not a JSON
    /// object; [`SchemaError::Nothing`] when no value or no field was seen.
    pub fn infer<'a>(
        values: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<JsonColumns, SchemaError> {
        let mut kinds: BTreeMap<String, Option<ColumnType>> = BTreeMap::new();
        let mut seen = 0usize;
        for (offset, bytes) in values {
            seen += 1;
            let object =
                parse_object(bytes).map_err(|reason| SchemaError::NotObject { offset, reason })?;
            for (field, value) in object {
                let kind = kinds.entry(field).or_default();
                *kind = merge(*kind, &value);
            }
        }
        if seen == 0 {
            return Err(SchemaError::Nothing("no value to infer from".into()));
        }
        if kinds.is_empty() {
            return Err(SchemaError::Nothing(
                "every value is an empty JSON object".into(),
            ));
        }
        let wanted: Vec<(String, String, ColumnType)> = kinds
            .into_iter()
            .map(|(field, ty)| {
                // An empty name is no column name DuckDB can select.
                let name = if field.is_empty() || reserved(&field) {
                    format!("value_{field}")
                } else {
                    field.clone()
                };
                (name, field, ty.unwrap_or(ColumnType::String))
            })
            .collect();
        let names = unique_names(wanted.iter().map(|(name, _, _)| name.as_str()));
        let columns = wanted
            .into_iter()
            .zip(names)
            .map(|((_, field, ty), name)| Column { name, field, ty })
            .collect();
        Ok(JsonColumns { columns })
    }

    /// The columns, in order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Fits one record's value to the columns.
    ///
    /// # Errors
    /// [`RowError`] naming `offset` and the reason: not JSON, not an
    /// object, or a field of another type (the first such field).
    pub fn fit(&self, offset: u64, value: &[u8]) -> Result<FittedRow, RowError> {
        // One pass: each named field straight into its cell, the others
        // kept for `_extra`. A value that is not a JSON object is parsed
        // again (rare) only to say what it is.
        let mut de = serde_json::Deserializer::from_slice(value);
        let parsed = serde::Deserializer::deserialize_map(
            &mut de,
            RowVisitor {
                columns: &self.columns,
            },
        )
        .and_then(|row| de.end().map(|()| row));
        match parsed {
            Ok(Ok((cells, extra))) => Ok(FittedRow {
                cells,
                extra: (!extra.is_empty()).then(|| raw_object(&extra)),
            }),
            Ok(Err(reason)) => Err(RowError { offset, reason }),
            Err(e) => Err(RowError {
                offset,
                reason: parse_object(value).err().unwrap_or_else(|| e.to_string()),
            }),
        }
    }
}

/// A JSON object of `fields`, each value as its JSON text.
fn raw_object(fields: &BTreeMap<String, &RawValue>) -> String {
    let mut out = String::from("{");
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(name.clone()).to_string());
        out.push(':');
        out.push_str(value.get());
    }
    out.push('}');
    out
}

/// Column names from `wanted` (in column order) that are all distinct and
/// none a fixed column: a name already taken by an earlier column gets the
/// first of `_2`, `_3`, ... that no column takes or wants, so the same
/// fields always give the same names and a field keeps its own name
/// whenever it can (`offset` is `value_offset` and a field `value_offset`
/// beside it becomes `value_offset_2`).
///
/// Names are compared in lower case, as DuckDB and Spark compare them (a
/// trial's `a` and `A` were one column there): `A` then `a` give `A` and
/// `a_2`.
fn unique_names<'a>(wanted: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let wanted: Vec<&str> = wanted.into_iter().collect();
    let all_wanted: BTreeSet<String> = wanted.iter().map(|w| w.to_lowercase()).collect();
    let mut taken: BTreeSet<String> = reserved_names().map(str::to_owned).collect();
    let mut names = Vec::with_capacity(wanted.len());
    for name in wanted {
        let chosen = if taken.contains(&name.to_lowercase()) {
            (2u64..)
                .map(|n| format!("{name}_{n}"))
                .find(|c| {
                    let lower = c.to_lowercase();
                    !taken.contains(&lower) && !all_wanted.contains(&lower)
                })
                .unwrap_or_else(|| name.to_owned())
        } else {
            name.to_owned()
        };
        taken.insert(chosen.to_lowercase());
        names.push(chosen);
    }
    names
}

/// Whether two column names are one for DuckDB and Spark.
fn same_name(a: &str, b: &str) -> bool {
    a.to_lowercase() == b.to_lowercase()
}

/// A field name, borrowed from the input when it has no escapes.
struct Key<'a>(std::borrow::Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Reads one JSON object into cells (`Ok(Err(reason))`: a field of another
/// type; the rest of the object is still consumed).
struct RowVisitor<'c> {
    columns: &'c [Column],
}

/// The cells, and the fields no column names as their JSON text (sorted,
/// the last of a repeated name).
type Fitted<'de> = Result<(Vec<Cell>, BTreeMap<String, &'de RawValue>), String>;

impl<'de> serde::de::Visitor<'de> for RowVisitor<'_> {
    type Value = Fitted<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Fitted<'de>, A::Error> {
        let mut cells = vec![Cell::Null; self.columns.len()];
        let mut extra = BTreeMap::new();
        let mut misfit = None;
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if !seen.insert(key.to_string()) {
                // One of the two values would go nowhere.
                misfit.get_or_insert_with(|| {
                    format!("field `{key}` is given twice in the object (one value would be lost)")
                });
            }
            // A `json` column and `_extra` keep the field's text as written
            // (parsed into a `Value`, an integer beyond 64 bits became a
            // rounded double); a typed column parses it once, as a `Value`.
            match self.columns.iter().position(|c| c.field == key) {
                Some(i) if self.columns[i].ty == ColumnType::Json => {
                    let raw: &'de RawValue = map.next_value()?;
                    cells[i] = match raw.get() {
                        "null" => Cell::Null,
                        text => Cell::Str(text.to_owned()),
                    };
                }
                Some(i) => {
                    // Through its text: an integer literal beyond 64 bits
                    // parses as a rounded double, which only the text
                    // tells apart from a written double.
                    let raw: &'de RawValue = map.next_value()?;
                    let value: Value =
                        serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
                    let column = &self.columns[i];
                    let rounded = rounded_integer(raw.get(), &value);
                    cells[i] = match cell(column.ty, &value) {
                        _ if value.is_null() => Cell::Null,
                        Some(c) if !rounded => c,
                        _ => {
                            misfit.get_or_insert_with(|| {
                                let hint = match column.ty {
                                    ColumnType::Timestamp => {
                                        " (ms since the Unix epoch or RFC 3339, years 1 to 9999)"
                                    }
                                    ColumnType::Double if value.is_number() => {
                                        " exactly (an integer beyond 2^53 loses digits in a double; declare the field int64 or json)"
                                    }
                                    _ => "",
                                };
                                format!(
                                    "field `{}` is {} where the column is {}{hint}",
                                    column.field,
                                    describe(&value),
                                    column.ty
                                )
                            });
                            Cell::Null
                        }
                    };
                }
                None => {
                    let raw: &'de RawValue = map.next_value()?;
                    extra.insert(key.into_owned(), raw);
                }
            }
        }
        Ok(match misfit {
            Some(reason) => Err(reason),
            None => Ok((cells, extra)),
        })
    }
}

/// The value as a JSON object, or why not.
fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, String> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!(
            "the value is {}, not a JSON object",
            describe(&other)
        )),
        Err(e) => Err(format!("the value is {}", json_error(&e))),
    }
}

/// Why bytes did not parse as JSON, for messages that begin "the value
/// is": "not JSON: {error}", except for JSON nested deeper than the
/// parser's limit (128 arrays or objects, serde_json's recursion limit),
/// which is valid JSON this reader does not take.
pub fn json_error(e: &serde_json::Error) -> String {
    if e.to_string().starts_with("recursion limit exceeded") {
        format!("JSON nested deeper than 128 levels, more than this reader takes ({e})")
    } else {
        format!("not JSON: {e}")
    }
}

/// A JSON value's kind, for messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(n) if n.is_i64() || n.is_u64() => format!("the integer {n}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.len() <= 40 => format!("the string {s:?}"),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// The type inference gives `v` alone (`None` for `null`).
fn kind_of(v: &Value) -> Option<ColumnType> {
    match v {
        Value::Null => None,
        Value::Bool(_) => Some(ColumnType::Bool),
        Value::Number(n) if n.is_i64() => Some(ColumnType::Int64),
        Value::Number(_) => Some(ColumnType::Double),
        Value::String(_) => Some(ColumnType::String),
        Value::Array(_) | Value::Object(_) => Some(ColumnType::Json),
    }
}

/// Widens the type seen so far with one more value.
fn merge(so_far: Option<ColumnType>, v: &Value) -> Option<ColumnType> {
    use ColumnType::{Double, Int64, Json};
    match (so_far, kind_of(v)) {
        (t, None) | (None, t) => t,
        (Some(a), Some(b)) if a == b => Some(a),
        (Some(Int64), Some(Double)) | (Some(Double), Some(Int64)) => Some(Double),
        _ => Some(Json),
    }
}

/// Whether `text` (a JSON value as written) is an integer literal: `-`?
/// digits, no fraction or exponent.
fn is_integer_literal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `text` is an integer literal that did not parse as a 64-bit
/// integer (`value`): serde_json rounds it to a double. `-0` parses as a
/// double too, exactly.
fn rounded_integer(text: &str, value: &Value) -> bool {
    is_integer_literal(text)
        && !(value.is_i64() || value.is_u64())
        && text.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

/// `n` as a double if the double holds it exactly: an integer beyond 2^53
/// (an id, a nanosecond count) would lose its last digits, so it does not
/// fit a double column (it goes to `_rejected`, whole).
fn exact_double(n: &serde_json::Number) -> Option<f64> {
    let f = n.as_f64()?;
    let exact = match (n.as_i64(), n.as_u64()) {
        (Some(i), _) => f as i128 == i128::from(i),
        (None, Some(u)) => f as i128 == i128::from(u),
        // A number with a fraction or exponent: already a double.
        (None, None) => true,
    };
    exact.then_some(f)
}

/// `v` as a cell of type `ty`, if it fits.
fn cell(ty: ColumnType, v: &Value) -> Option<Cell> {
    match (ty, v) {
        (ColumnType::Bool, Value::Bool(b)) => Some(Cell::Bool(*b)),
        (ColumnType::Int64, Value::Number(n)) => n.as_i64().map(Cell::Int),
        (ColumnType::Double, Value::Number(n)) => exact_double(n).map(Cell::Double),
        (ColumnType::String, Value::String(s)) => Some(Cell::Str(s.clone())),
        (ColumnType::Timestamp, Value::Number(n)) => n
            .as_i64()
            .filter(|ms| (MIN_TIMESTAMP_MS..=MAX_TIMESTAMP_MS).contains(ms))
            .map(Cell::Timestamp),
        (ColumnType::Timestamp, Value::String(s)) => crate::time::parse_rfc3339_ms(s)
            .ok()
            .filter(|ms| (MIN_TIMESTAMP_MS..=MAX_TIMESTAMP_MS).contains(ms))
            .map(Cell::Timestamp),
        (ColumnType::Json, v) => Some(Cell::Str(v.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_lists_parse_and_refuse_bad_entries() {
        let cols = JsonColumns::parse_list("a:double, b:int,c:str").expect("parses");
        let types: Vec<_> = cols
            .columns()
            .iter()
            .map(|c| (c.name.as_str(), c.ty))
            .collect();
        assert_eq!(
            types,
            [
                ("a", ColumnType::Double),
                ("b", ColumnType::Int64),
                ("c", ColumnType::String)
            ]
        );
        assert!(matches!(
            JsonColumns::parse_list("a"),
            Err(SchemaError::Spec { .. })
        ));
        assert!(matches!(
            JsonColumns::parse_list("a:decimal"),
            Err(SchemaError::UnknownType { .. })
        ));
        assert!(matches!(
            JsonColumns::parse_list("offset:int64"),
            Err(SchemaError::Collision { .. })
        ));
        assert!(matches!(
            JsonColumns::parse_list("a:int64,a:double"),
            Err(SchemaError::Duplicate { .. })
        ));
        assert!(matches!(
            JsonColumns::parse_list(""),
            Err(SchemaError::Nothing(_))
        ));
    }

    #[test]
    fn inference_widens_numbers_and_falls_back_to_json() {
        let values: Vec<(u64, &[u8])> = vec![
            (0, br#"{"n":1,"x":1,"s":"a","o":null,"offset":3}"#),
            (1, br#"{"n":2,"x":1.5,"s":2,"b":true}"#),
        ];
        let cols = JsonColumns::infer(values).expect("infers");
        let got: Vec<_> = cols
            .columns()
            .iter()
            .map(|c| (c.name.as_str(), c.field.as_str(), c.ty))
            .collect();
        assert_eq!(
            got,
            [
                ("b", "b", ColumnType::Bool),
                ("n", "n", ColumnType::Int64),
                ("o", "o", ColumnType::String),
                ("value_offset", "offset", ColumnType::Int64),
                ("s", "s", ColumnType::Json),
                ("x", "x", ColumnType::Double),
            ]
        );
        let err = JsonColumns::infer(vec![(7u64, &b"[1]"[..])]).expect_err("array");
        assert!(err.to_string().contains("offset 7"), "{err}");
        assert!(JsonColumns::infer(Vec::<(u64, &[u8])>::new()).is_err());
    }

    /// A lakehouse trial: `date` was overwritten by the Hive partition
    /// value on read, `a`/`A` and `temp`/`Temp` read as one column in
    /// DuckDB, and a timestamp in year 318,857 made a file unreadable.
    #[test]
    fn date_and_names_differing_in_case_are_kept_apart_and_timestamps_in_range() {
        let cols = JsonColumns::infer([(
            0u64,
            &br#"{"date":"2020-01-01","A":"up","a":10,"Offset":1}"#[..],
        )])
        .unwrap();
        let names: Vec<&str> = cols.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["A", "value_Offset", "a_2", "value_date"]);
        for list in ["date:string", "Offset:int64", "TIMESTAMP:string"] {
            assert!(
                matches!(
                    JsonColumns::parse_list(list),
                    Err(SchemaError::Collision { .. })
                ),
                "{list}"
            );
        }
        let err = JsonColumns::parse_list("Temp:double,temp:double").unwrap_err();
        assert_eq!(
            err.to_string(),
            "fields `temp` and `Temp` differ only in letter case, which DuckDB and Spark read as one column name: declare one of them"
        );
        let ts = JsonColumns::parse_list("ts:timestamp").unwrap();
        for fits in [
            "0",
            "-1",
            "253402300799999",
            "-62135596800000",
            "\"9999-12-31T23:59:59.999Z\"",
        ] {
            let value = format!(r#"{{"ts":{fits}}}"#);
            assert!(ts.fit(1, value.as_bytes()).is_ok(), "{fits}");
        }
        for misfit in ["9999999999999999", "253402300800000", "-62135596800001"] {
            let value = format!(r#"{{"ts":{misfit}}}"#);
            let err = ts.fit(7, value.as_bytes()).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "offset 7: field `ts` is the integer {misfit} where the column is timestamp (ms since the Unix epoch or RFC 3339, years 1 to 9999)"
                )
            );
        }
    }

    /// Each column's name and the field it holds, in order.
    fn names_and_fields(cols: &JsonColumns) -> Vec<(&str, &str)> {
        cols.columns()
            .iter()
            .map(|c| (c.name.as_str(), c.field.as_str()))
            .collect()
    }

    #[test]
    fn a_field_with_an_empty_name_gets_a_column_name() {
        // DuckDB renamed a column named "" and could not select it.
        let values: Vec<(u64, &[u8])> = vec![(1, br#"{"":1,"value_":"x","a":true}"#)];
        let cols = JsonColumns::infer(values).expect("infers");
        let got = names_and_fields(&cols);
        assert_eq!(got, [("value_", ""), ("a", "a"), ("value__2", "value_")]);
        assert!(matches!(
            JsonColumns::declared([(" ", "int64")]),
            Err(SchemaError::EmptyName)
        ));
    }

    #[test]
    fn inferred_names_are_unique_when_a_prefixed_field_meets_its_namesake() {
        // `offset` becomes `value_offset`, which the field `value_offset`
        // also wants; `value_offset_2` is a field of its own too.
        let values: Vec<(u64, &[u8])> = vec![(
            3,
            br#"{"offset":1,"value_offset":-1,"key":"k","headers":[],"ts":5,"value_offset_2":"x","value":0,"value_value":true}"#,
        )];
        let cols = JsonColumns::infer(values).expect("infers");
        let got = names_and_fields(&cols);
        assert_eq!(
            got,
            [
                ("value_headers", "headers"),
                ("value_key", "key"),
                ("value_offset", "offset"),
                ("ts", "ts"),
                ("value_value", "value"),
                ("value_offset_3", "value_offset"),
                ("value_offset_2", "value_offset_2"),
                ("value_value_2", "value_value"),
            ]
        );
        let names: BTreeSet<&str> = got.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), got.len(), "names are distinct");
        assert!(names.iter().all(|n| !FIXED_COLUMNS.contains(n)));
        // Each field still lands in its own column.
        let row = cols
            .fit(
                3,
                br#"{"offset":7,"value_offset":-7,"value_offset_2":"y","value_value":false}"#,
            )
            .expect("fits");
        assert_eq!(row.cells[2], Cell::Int(7));
        assert_eq!(row.cells[5], Cell::Int(-7));
        assert_eq!(row.cells[6], Cell::Str("y".into()));
        assert_eq!(row.cells[7], Cell::Bool(false));
    }

    #[test]
    fn json_cells_and_extra_keep_integers_beyond_64_bits_exactly() {
        // Parsed into a Value they became rounded doubles
        // (-9.223372036854776e18, 1.2345678901234568e29), unannounced.
        let cols = JsonColumns::parse_list("j:json,k:json,n:int64").expect("ok");
        let row = cols
            .fit(
                1,
                br#"{"j":-9223372036854775809,"k":{"big":[18446744073709551616]},"n":1,"zz":123456789012345678901234567890,"a\"b":null}"#,
            )
            .expect("fits");
        assert_eq!(
            row.cells,
            [
                Cell::Str("-9223372036854775809".into()),
                Cell::Str(r#"{"big":[18446744073709551616]}"#.into()),
                Cell::Int(1)
            ]
        );
        assert_eq!(
            row.extra.as_deref(),
            Some(r#"{"a\"b":null,"zz":123456789012345678901234567890}"#)
        );
    }

    #[test]
    fn fitting_types_cells_keeps_extra_fields_and_names_the_offset_of_a_misfit() {
        let cols = JsonColumns::parse_list("p:double,n:int64,t:timestamp,j:json").expect("ok");
        let row = cols
            .fit(
                5,
                br#"{"p":3,"n":-2,"t":"2006-12-16T17:24:00Z","j":[1],"other":"x"}"#,
            )
            .expect("fits");
        assert_eq!(
            row.cells,
            [
                Cell::Double(3.0),
                Cell::Int(-2),
                Cell::Timestamp(1_166_289_840_000),
                Cell::Str("[1]".into())
            ]
        );
        assert_eq!(row.extra.as_deref(), Some(r#"{"other":"x"}"#));
        let nulls = cols.fit(7, br#"{"j":null,"p":null}"#).expect("nulls");
        assert_eq!(
            nulls.cells,
            [Cell::Null, Cell::Null, Cell::Null, Cell::Null]
        );
        let err = cols.fit(8, br#"{"p":1} x"#).expect_err("trailing bytes");
        assert!(err.reason.contains("not JSON"), "{err}");
        let empty = cols.fit(6, b"{}").expect("all absent");
        assert!(empty.cells.iter().all(|c| *c == Cell::Null) && empty.extra.is_none());
        // An integer a double cannot hold exactly does not fit a double
        // column (rounded, it would be another number); 2^53 and 2^60 do.
        let exact = cols
            .fit(13, br#"{"p":9007199254740992}"#)
            .expect("2^53 is a double");
        assert_eq!(exact.cells[0], Cell::Double(9_007_199_254_740_992.0));
        cols.fit(13, br#"{"p":1152921504606846976}"#)
            .expect("2^60 is a double");
        // Beyond 64 bits too (the bad-input trial: 2^70 + 1, -2^63 - 1 and
        // 2^64 + 1 were written rounded, "0 records did not fit"), also to
        // an int64 column; a double written as such still fits.
        for big in [
            "9007199254740993",
            "18446744073709551615",
            "-9223372036854775807",
            "1180591620717411303425",
            "-9223372036854775809",
            "18446744073709551617",
        ] {
            let value = format!(r#"{{"p":{big}}}"#);
            let err = cols.fit(14, value.as_bytes()).expect_err(big);
            assert!(err.reason.contains("loses digits in a double"), "{err}");
        }
        for big in ["18446744073709551617", "-9223372036854775809"] {
            let value = format!(r#"{{"n":{big}}}"#);
            let err = cols.fit(14, value.as_bytes()).expect_err(big);
            assert!(err.reason.contains("field `n`"), "{err}");
        }
        cols.fit(14, br#"{"p":1e21}"#).expect("a double as written");
        cols.fit(14, br#"{"p":-0}"#).expect("-0 is exact");
        // A field given twice: one value would go nowhere.
        let err = cols
            .fit(15, br#"{"other":1,"other":2}"#)
            .expect_err("twice");
        assert!(err.reason.contains("`other` is given twice"), "{err}");
        let err = cols.fit(16, br#"{"n":1,"n":2}"#).expect_err("twice");
        assert!(err.reason.contains("`n` is given twice"), "{err}");
        let err = cols.fit(9, br#"{"n":1.5}"#).expect_err("float in int64");
        assert_eq!(err.offset, 9);
        assert!(err.reason.contains("field `n`"), "{err}");
        let err = cols.fit(10, b"not json").expect_err("not json");
        assert!(
            err.to_string()
                .starts_with("offset 10: the value is not JSON")
        );
        let err = cols.fit(11, b"42").expect_err("not an object");
        assert!(err.reason.contains("not a JSON object"), "{err}");
        // Valid JSON nested past the parser's limit is said as such, not
        // as "not JSON" (from the lakehouse trial).
        let deep = format!("{{\"p\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        let err = cols.fit(12, deep.as_bytes()).expect_err("too deep");
        assert!(
            err.to_string()
                .starts_with("offset 12: the value is JSON nested deeper than 128 levels"),
            "{err}"
        );
    }
}
