//! Tributary's archive as a lakehouse: records of archived segments written
//! as Parquet through Arrow, readable by DuckDB, pandas, Spark or Trino
//! straight from the bucket.
//!
//! - [`table`]: the Parquet layout (fixed columns `offset`, `timestamp`,
//!   `key`, `headers`, then the raw `value`, typed JSON columns, or a
//!   rejected record's `value` and `_reason`) and its writer.
//! - [`schema`]: typed columns from JSON values, declared or inferred, and
//!   the check that a value fits.
//! - [`time`]: RFC 3339 and the `date=` partition of a timestamp.
//!
//! Used by `tribctl archive export --format parquet` and the tier
//! service's continuous lakehouse writer; never by the edge agent.
#![warn(missing_docs)]

pub mod schema;
pub mod table;
pub mod time;

pub use schema::{ColumnType, JsonColumns, RowError, SchemaError};
pub use table::{Layout, ParquetOptions, TableError, TableWriter};
