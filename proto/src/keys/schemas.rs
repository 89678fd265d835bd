//! Builders for `/schemas/...`.

use super::{MetadataKey, SubjectName};

/// `/schemas/_global/next_schema_id`.
pub fn next_schema_id() -> String {
    MetadataKey::NextSchemaId.to_string()
}

/// `/schemas/{subject}/metadata`.
pub fn metadata(subject: &SubjectName) -> String {
    MetadataKey::SchemaMetadata {
        subject: subject.clone(),
    }
    .to_string()
}

/// `/schemas/{subject}/compatibility`.
pub fn compatibility(subject: &SubjectName) -> String {
    MetadataKey::SchemaCompatibility {
        subject: subject.clone(),
    }
    .to_string()
}

/// `/schemas/_index/by_id/{schema_id}`.
pub fn by_id(schema_id: u64) -> String {
    MetadataKey::SchemaById { schema_id }.to_string()
}
