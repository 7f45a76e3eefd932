//! The OpenAPI document of the JSON API, made from `proto/` itself (the
//! descriptor set the build compiles), so it cannot drift from the
//! contract: every served call's path, its request and answer schemas in
//! the proto3 JSON mapping, and the proto comments as descriptions.
//! docs/openapi.json is this document; a test keeps the two equal.

use std::collections::BTreeMap;

use prost::Message;
use prost_types::{
    field_descriptor_proto::{Label, Type},
    DescriptorProto, FieldDescriptorProto, FileDescriptorSet, SourceCodeInfo,
};
use serde_json::{json, Map, Value};

use super::calls::Call;

/// Where the document is served (to any caller that authenticates).
pub const PATH: &str = "/v1/openapi.json";

/// The schema name of a refusal's body.
const ERROR: &str = "Error";

/// The document, from the compiled contract.
pub fn document() -> Result<Value, String> {
    let set = FileDescriptorSet::decode(fenced_proto::FILE_DESCRIPTOR_SET)
        .map_err(|e| format!("the compiled contract does not decode: {e}"))?;
    let mut schemas = Map::new();
    let mut methods = BTreeMap::new();
    for file in &set.file {
        let package = file.package();
        let comments = Comments::of(file.source_code_info.as_ref());
        for (i, message) in file.message_type.iter().enumerate() {
            add_message(&mut schemas, package, message, &comments, &[4, i as i32]);
        }
        for (i, enumeration) in file.enum_type.iter().enumerate() {
            let names: Vec<&str> = enumeration.value.iter().map(|v| v.name()).collect();
            let mut schema = json!({ "type": "string", "enum": names });
            describe(&mut schema, comments.at(&[5, i as i32]));
            schemas.insert(format!("{package}.{}", enumeration.name()), schema);
        }
        for (s, service) in file.service.iter().enumerate() {
            for (m, method) in service.method.iter().enumerate() {
                let name = format!("{package}.{}/{}", service.name(), method.name());
                let about = comments.at(&[6, s as i32, 2, m as i32]);
                methods.insert(name, (method.clone(), about.map(str::to_string)));
            }
        }
    }
    schemas.insert(
        ERROR.into(),
        json!({
            "type": "object",
            "description": "A refusal: the gRPC status code by number and by name, and why.",
            "properties": {
                "code": { "type": "integer", "minimum": 0, "maximum": 16 },
                "status": { "type": "string" },
                "message": { "type": "string" },
            },
            "required": ["code", "status", "message"],
        }),
    );
    let mut paths = Map::new();
    for call in Call::ALL {
        let Some((method, about)) = methods.get(call.method()) else {
            return Err(format!("{} is served but not in proto/", call.method()));
        };
        let path = call.path();
        paths.insert(path.clone(), operation(*call, method, about.as_deref())?);
    }
    paths.insert(
        PATH.into(),
        json!({ "get": {
            "operationId": "OpenApi",
            "summary": "This document.",
            "tags": ["Api"],
            "responses": {
                "200": { "description": "The document.", "content": {
                    "application/json": { "schema": { "type": "object" } } } },
                "default": error_response(),
            },
        }}),
    );
    Ok(json!({
        "openapi": "3.0.3",
        "info": {
            "title": "fenced",
            "version": "v1",
            "description": "fenced's calls as JSON over HTTP, on each node's client port, \
                with the same TLS, authentication, permissions and bounds as gRPC. \
                Messages use the proto3 JSON mapping: names in lowerCamelCase (the \
                proto names are accepted too), 64-bit integers as decimal strings, \
                bytes (resource names, owner ids, keys) in base64, enums by name. \
                Every call is a POST with a JSON body (content-type: application/json). \
                A refusal carries the HTTP status of its gRPC code and an Error body.",
        },
        "servers": [{ "url": "/" }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer",
                    "description": "A token from the cluster's auth_tokens file (with auth on)." },
            },
        },
        "security": [{ "bearer": [] }, {}],
    }))
}

/// The document as served and as committed: pretty, with a final newline.
pub fn text() -> Result<String, String> {
    let doc = document()?;
    serde_json::to_string_pretty(&doc)
        .map(|t| t + "\n")
        .map_err(|e| format!("the OpenAPI document does not encode: {e}"))
}

fn error_response() -> Value {
    json!({
        "description": "A refusal, with the HTTP status of its gRPC code.",
        "content": { "application/json": { "schema": reference(ERROR) } },
    })
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// `.fenced.v1.X` → `fenced.v1.X`.
fn type_name(proto: &str) -> &str {
    proto.trim_start_matches('.')
}

fn operation(
    call: Call,
    method: &prost_types::MethodDescriptorProto,
    about: Option<&str>,
) -> Result<Value, String> {
    let (service, name) = call
        .method()
        .rsplit_once('/')
        .ok_or_else(|| format!("{}: not Service/Method", call.method()))?;
    let service = service.rsplit('.').next().unwrap_or(service);
    let answer = if call.streams() {
        json!({
            "description": format!(
                "Server-sent events: one `data:` line per {} in JSON; an `error` event \
                 (an Error) ends the stream on a refusal; comment lines keep it alive.",
                type_name(method.output_type())
            ),
            "content": { super::sse::EVENT_STREAM: { "schema": { "type": "string" } } },
        })
    } else {
        json!({
            "description": "The answer.",
            "content": { "application/json": { "schema": reference(type_name(method.output_type())) } },
        })
    };
    let mut post = json!({
        "operationId": format!("{service}_{name}"),
        "tags": [service],
        "requestBody": {
            "required": false,
            "content": { "application/json": {
                "schema": reference(type_name(method.input_type())) } },
        },
        "responses": { "200": answer, "default": error_response() },
    });
    describe(&mut post, about);
    Ok(json!({ "post": post }))
}

fn describe(schema: &mut Value, about: Option<&str>) {
    if let (Some(text), Some(object)) = (about, schema.as_object_mut()) {
        object.insert("description".into(), Value::String(text.to_string()));
    }
}

fn add_message(
    schemas: &mut Map<String, Value>,
    scope: &str,
    message: &DescriptorProto,
    comments: &Comments,
    path: &[i32],
) {
    let name = format!("{scope}.{}", message.name());
    let maps: BTreeMap<String, &DescriptorProto> = message
        .nested_type
        .iter()
        .filter(|n| n.options.as_ref().is_some_and(|o| o.map_entry()))
        .map(|n| (format!(".{name}.{}", n.name()), n))
        .collect();
    let mut properties = Map::new();
    for (i, field) in message.field.iter().enumerate() {
        let mut schema = match maps.get(field.type_name()) {
            Some(entry) => {
                let value = entry.field.iter().find(|f| f.number() == 2);
                json!({ "type": "object",
                    "additionalProperties": value.map_or(json!({}), scalar_or_ref) })
            }
            None if field.label() == Label::Repeated => {
                json!({ "type": "array", "items": scalar_or_ref(field) })
            }
            None => scalar_or_ref(field),
        };
        let mut field_path = path.to_vec();
        field_path.extend([2, i as i32]);
        let about = comments.at(&field_path);
        if schema.get("$ref").is_some() && about.is_some() {
            // A `$ref` takes no siblings in OpenAPI 3.0.
            schema = json!({ "allOf": [schema] });
        }
        describe(&mut schema, about);
        properties.insert(field.json_name().to_string(), schema);
        if let Some(date) = super::reply::date_field(field.json_name()) {
            properties.insert(
                date.to_string(),
                json!({ "type": "string", "format": "date-time", "readOnly": true,
                    "description": format!("`{}` as an RFC 3339 date (UTC), for people: \
                        in JSON answers only, absent when unknown.", field.json_name()) }),
            );
        }
    }
    let mut schema = json!({ "type": "object", "properties": properties });
    describe(&mut schema, comments.at(path));
    schemas.insert(name.clone(), schema);
    for (i, nested) in message.nested_type.iter().enumerate() {
        if nested.options.as_ref().is_some_and(|o| o.map_entry()) {
            continue;
        }
        let mut nested_path = path.to_vec();
        nested_path.extend([3, i as i32]);
        add_message(schemas, &name, nested, comments, &nested_path);
    }
}

/// A field's schema in the proto3 JSON mapping.
fn scalar_or_ref(field: &FieldDescriptorProto) -> Value {
    match field.r#type() {
        Type::Message | Type::Group | Type::Enum => reference(type_name(field.type_name())),
        Type::String => json!({ "type": "string" }),
        Type::Bytes => json!({ "type": "string", "format": "byte" }),
        Type::Bool => json!({ "type": "boolean" }),
        Type::Double | Type::Float => json!({ "type": "number" }),
        Type::Int32 | Type::Sint32 | Type::Sfixed32 => json!({
            "type": "integer", "format": "int32",
            "minimum": i32::MIN, "maximum": i32::MAX }),
        Type::Uint32 | Type::Fixed32 => json!({
            "type": "integer", "format": "int64", "minimum": 0, "maximum": u32::MAX }),
        Type::Int64 | Type::Sint64 | Type::Sfixed64 => json!({
            "type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$" }),
        Type::Uint64 | Type::Fixed64 => json!({
            "type": "string", "format": "uint64", "pattern": "^[0-9]{1,20}$" }),
    }
}

/// The leading comments of a file's declarations, by descriptor path.
struct Comments(BTreeMap<Vec<i32>, String>);

impl Comments {
    fn of(info: Option<&SourceCodeInfo>) -> Self {
        let mut by_path = BTreeMap::new();
        for location in info.map(|i| i.location.as_slice()).unwrap_or_default() {
            let text = location.leading_comments().trim();
            if !text.is_empty() {
                let joined: Vec<&str> = text.lines().map(str::trim).collect();
                by_path.insert(location.path.clone(), joined.join(" "));
            }
        }
        Self(by_path)
    }

    fn at(&self, path: &[i32]) -> Option<&str> {
        self.0.get(path).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// docs/openapi.json is what the contract makes: a change to proto/
    /// without `cargo run -p fenced-server --bin fenced -- openapi >
    /// docs/openapi.json` fails here.
    #[test]
    fn the_committed_document_is_the_one_proto_makes() {
        let committed = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json"),
        )
        .unwrap();
        let made = text().unwrap();
        assert!(
            committed == made,
            "docs/openapi.json is out of step with proto/: run \
             `cargo run -p fenced-server --bin fenced -- openapi > docs/openapi.json`"
        );
    }

    #[test]
    fn every_served_call_has_a_path_and_its_schemas() {
        let doc = document().unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for call in Call::ALL {
            let post = &doc["paths"][call.path().as_str()]["post"];
            assert!(post.is_object(), "{}", call.path());
            let request = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .unwrap();
            let name = request.trim_start_matches("#/components/schemas/");
            assert!(schemas.contains_key(name), "{name}");
        }
        let acquire = &schemas["fenced.v1.AcquireRequest"]["properties"];
        assert_eq!(acquire["resource"]["format"], "byte");
        assert_eq!(acquire["ttlMs"]["format"], "uint64");
        assert!(acquire["ownerId"]["description"]
            .as_str()
            .unwrap()
            .contains("UUID"));
        let kinds = &schemas["fenced.v1.EventKind"]["enum"];
        assert!(kinds
            .as_array()
            .unwrap()
            .contains(&json!("EVENT_KIND_GRANTED")));
    }
}
