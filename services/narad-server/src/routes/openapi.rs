//! The OpenAPI document: what utoipa derives from the routes' annotations,
//! completed with what the annotations cannot hold.
//!
//! - **Wire components.** Every file of `schema/` is a component, embedded
//!   at build time (`build.rs`): `commands/start-run.json` is
//!   `commands.start-run`, each `$defs` entry of `defs.json` and
//!   `envelopes.json` is `defs.<name>` / `envelopes.<name>`. The files are
//!   copied as they are, with their `$ref`s pointed at the components: the
//!   document and `schema/` are one source (a test compares them).
//! - **Unions** of the wire components, generated from the same list:
//!   `AuthorityEvent`, `WatchEvent`, `HydrateRecord`, with `type` as their
//!   discriminator; and the SSE frames of the two streams.
//! - **`Error`**, the envelope of `schema/documents/error.json` with `code`
//!   narrowed to the catalog of [`ErrorCode`].
//! - **Error answers.** Every 4xx or 5xx an operation declares answers the
//!   `Error` envelope. Statuses that every operation of a kind can answer
//!   are added here once rather than on each route: 401, 403, 500 and 503
//!   on every operation that takes a credential; 400 and 413 on every one
//!   with a request body; 400 on every one with parameters.
//! - **Parameters are never null**: an absent one is left out, and text
//!   cannot be `null` in a path, query or header (utoipa makes optional
//!   headers nullable).
//! - **Required bodies.** A request body is required, but for the
//!   operations of [`OPTIONAL_BODIES`], which read an empty body as `{}`
//!   (utoipa marks a body given by `ref(...)` neither way).

use std::collections::BTreeMap;

use narad_protocol::ErrorCode;
use serde_json::{Map, Value, json};

/// Every file of `schema/`, by its path there, as the build found them.
pub const SCHEMA_FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/schema_files.rs"));

/// Where components live.
pub const COMPONENTS: &str = "#/components/schemas/";

/// The error envelope, with the catalog's codes.
pub const ERROR: &str = "Error";

/// The companions of `Narad-Signature` (the `extensionSignature` scheme)
/// on the operations that take signed calls: the four travel together
/// (`crate::signature`).
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code, reason = "documents headers the signature layer reads")]
pub struct SignatureHeaders {
    /// With extensionSignature: seconds since the epoch, within 60 s of the
    /// server's clock.
    #[serde(rename = "Narad-Timestamp")]
    #[param(pattern = "^[0-9]{1,12}$")]
    timestamp: Option<String>,
    /// With extensionSignature: unique per call (a replay is refused).
    #[serde(rename = "Narad-Request-Id")]
    #[param(min_length = 1)]
    request_id: Option<String>,
    /// With extensionSignature: `publisher/name` of the registered
    /// extension whose secret verifies the call.
    #[serde(rename = "Narad-Extension")]
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}/[A-Za-z0-9._-]{1,64}$")]
    extension: Option<String>,
}

/// The operations whose request body may be empty (read as `{}`).
pub const OPTIONAL_BODIES: &[&str] = &["claimRun", "releaseRun"];

/// The OpenAPI document of every route, as `GET /openapi.json` serves it.
pub fn document() -> Value {
    let (_, api) = super::router().split_for_parts();
    complete(&api)
}

/// The document as served: pretty JSON.
pub fn document_json(api: &utoipa::openapi::OpenApi) -> String {
    serde_json::to_string_pretty(&complete(api)).expect("the OpenAPI document serialises")
}

/// Completes utoipa's document (see the module's documentation).
pub fn complete(api: &utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(api).expect("the OpenAPI document serialises");
    let schemas = doc["components"]
        .as_object_mut()
        .expect("the document has components")
        .entry("schemas")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("components.schemas is an object");
    for (name, schema) in wire_components() {
        schemas.insert(name, schema);
    }
    for (name, schema) in composite_components() {
        schemas.insert(name, schema);
    }
    let mut optional_bodies = 0;
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            for (method, op) in item.as_object_mut().into_iter().flatten() {
                if !is_method(method) {
                    continue;
                }
                if op.get("requestBody").is_some() {
                    let optional = body_is_optional(&op["operationId"]);
                    optional_bodies += usize::from(optional);
                    op["requestBody"]["required"] = json!(!optional);
                }
                complete_operation(op);
            }
        }
    }
    assert_eq!(
        optional_bodies,
        OPTIONAL_BODIES.len(),
        "every operation of OPTIONAL_BODIES exists and takes a body"
    );
    doc
}

fn body_is_optional(operation_id: &Value) -> bool {
    operation_id
        .as_str()
        .is_some_and(|id| OPTIONAL_BODIES.contains(&id))
}

fn is_method(key: &str) -> bool {
    matches!(
        key,
        "get" | "put" | "post" | "delete" | "options" | "head" | "patch" | "trace"
    )
}

/// The component name of a file of `schema/`: its path without `.json`,
/// folders joined by dots.
pub fn component_name(path: &str) -> String {
    path.trim_end_matches(".json").replace('/', ".")
}

/// A file that only holds shared `$defs` (no schema of its own): each
/// definition is a component of its own.
fn is_definitions(file: &Value) -> bool {
    file.get("$defs").is_some() && file.get("type").is_none()
}

/// The wire components, by name: each file of `schema/` (or each of its
/// `$defs`), with its `$ref`s pointed at components.
pub fn wire_components() -> BTreeMap<String, Value> {
    let files = parsed_files();
    let mut out = BTreeMap::new();
    for (path, file) in &files {
        let name = component_name(path);
        if is_definitions(file) {
            for (def, schema) in file["$defs"].as_object().expect("$defs is an object") {
                let mut schema = schema.clone();
                rewrite_refs(&mut schema, path, &files);
                out.insert(format!("{name}.{def}"), schema);
            }
        } else {
            let mut schema = file.clone();
            rewrite_refs(&mut schema, path, &files);
            out.insert(name, schema);
        }
    }
    out
}

fn parsed_files() -> BTreeMap<&'static str, Value> {
    SCHEMA_FILES
        .iter()
        .map(|(path, text)| {
            let value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("schema/{path} is not JSON: {e}"));
            (*path, value)
        })
        .collect()
}

/// Points every `$ref` of `schema` (from the file at `path`) at the
/// component it names.
fn rewrite_refs(schema: &mut Value, path: &str, files: &BTreeMap<&str, Value>) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(target) if key == "$ref" => {
                        *target = component_ref(path, target, files);
                    }
                    _ => rewrite_refs(value, path, files),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                rewrite_refs(item, path, files);
            }
        }
        _ => {}
    }
}

/// The component reference of `target`, a `$ref` written in the file at
/// `from` (relative to it, as the files resolve without `$id`).
fn component_ref(from: &str, target: &str, files: &BTreeMap<&str, Value>) -> String {
    let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
    let file = if file.is_empty() {
        from.to_owned()
    } else {
        resolve(from, file)
    };
    let definitions = files
        .get(file.as_str())
        .unwrap_or_else(|| panic!("schema/{from}: $ref {target} names no file of schema/"));
    let name = component_name(&file);
    if is_definitions(definitions) {
        let rest = fragment.strip_prefix("/$defs/").unwrap_or_else(|| {
            panic!("schema/{from}: $ref {target} does not name a definition of {file}")
        });
        let (def, inner) = rest.split_once('/').map_or((rest, ""), |(d, i)| (d, i));
        let inner = if inner.is_empty() {
            String::new()
        } else {
            format!("/{inner}")
        };
        format!("{COMPONENTS}{name}.{def}{inner}")
    } else {
        format!("{COMPONENTS}{name}{fragment}")
    }
}

/// `relative` (a path with `..` and `.` segments) from the folder of `from`.
fn resolve(from: &str, relative: &str) -> String {
    let mut parts: Vec<&str> = from.split('/').collect();
    parts.pop();
    for segment in relative.split('/') {
        match segment {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// The union of the wire components of one folder of `schema/`, with the
/// wire `type` as its discriminator.
fn union_of(folder: &str, description: &str) -> Value {
    let members: Vec<(String, String)> = SCHEMA_FILES
        .iter()
        .filter_map(|(path, _)| {
            let rest = path.strip_prefix(folder)?.strip_prefix('/')?;
            let wire_type = rest.strip_suffix(".json")?;
            Some((wire_type.to_owned(), component_name(path)))
        })
        .collect();
    let one_of: Vec<Value> = members
        .iter()
        .map(|(_, name)| json!({ "$ref": format!("{COMPONENTS}{name}") }))
        .collect();
    let mapping: Map<String, Value> = members
        .iter()
        .map(|(wire, name)| (wire.clone(), json!(format!("{COMPONENTS}{name}"))))
        .collect();
    json!({
        "description": description,
        "oneOf": one_of,
        "discriminator": { "propertyName": "type", "mapping": mapping },
    })
}

/// The components made of others: unions, stream frames, the typed error
/// envelope.
pub fn composite_components() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    out.insert(
        "AuthorityEvent".to_owned(),
        union_of(
            "events",
            "An authority event of the journal (§5), any type of schema/events/.",
        ),
    );
    out.insert(
        "WatchEvent".to_owned(),
        union_of("watch", "A watch event (§9.4), any type of schema/watch/."),
    );
    out.insert(
        "HydrateRecord".to_owned(),
        union_of(
            "hydrate",
            "A hydrate record (§9.7), any type of schema/hydrate/.",
        ),
    );
    out.insert(ERROR.to_owned(), error_component());
    out.insert("ProposedEvent".to_owned(), proposed_event());
    out.insert(
        "OpenApiDocument".to_owned(),
        json!({
            "description": "An OpenAPI 3.1 document (https://spec.openapis.org/oas/v3.1.0): this one.",
            "type": "object",
            "required": ["openapi", "info", "paths", "components"],
            "properties": {
                "openapi": { "type": "string", "pattern": "^3\\.1\\.\\d+$" },
                "info": { "type": "object" },
                "paths": { "type": "object" },
                "components": { "type": "object" },
            },
        }),
    );
    out.insert(
        "AppendRequest".to_owned(),
        json!({
            "description": "A batch of proposed authority events, appended atomically: all or none.",
            "type": "object",
            "required": ["events"],
            "properties": {
                "events": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": narad_journal::append::MAX_BATCH,
                    "items": { "$ref": format!("{COMPONENTS}ProposedEvent") },
                },
                "expectedSessionSequence": {
                    "description": "Append only if the session's sequence is this one (NRD-0203 otherwise).",
                    "$ref": format!("{COMPONENTS}defs.uint"),
                },
            },
            "additionalProperties": false,
        }),
    );
    out.insert(
        "ReplayGap".to_owned(),
        json!({
            "description": "The data of a `replay-gap` frame of GET /v1/events: retention forgot part of the range after Last-Event-ID; re-read history from what you hold.",
            "type": "object",
            "required": ["type", "protocolVersion", "forgottenThrough", "message"],
            "properties": {
                "type": { "const": "replay-gap" },
                "protocolVersion": { "$ref": format!("{COMPONENTS}defs.protocolVersion") },
                "forgottenThrough": {
                    "description": "The last eventId retention forgot, when known.",
                    "oneOf": [{ "$ref": format!("{COMPONENTS}defs.id") }, { "type": "null" }],
                },
                "sessionId": { "$ref": format!("{COMPONENTS}defs.id") },
                "message": { "type": "string" },
            },
        }),
    );
    let capabilities = frame(
        "capabilities",
        None,
        "control.capabilities",
        "The first frame: the capability document of the stream.",
    );
    let authority = frame(
        "message",
        Some("The event's eventId: resume after it with Last-Event-ID."),
        "AuthorityEvent",
        "An authority event (no `event:` line).",
    );
    let watch = frame(
        "message",
        Some("The watch event's eventId: resume after it with Last-Event-ID."),
        "WatchEvent",
        "A watch event (no `event:` line).",
    );
    out.insert(
        "SessionStreamFrame".to_owned(),
        json!({
            "description": "One server-sent event of GET /v1/sessions/{sessionId}/stream, as a client parses it: `event` (absent for authority and watch events), `id` and `data` (JSON).",
            "oneOf": [
                capabilities,
                authority,
                watch,
                frame("hydrate", None, "HydrateRecord", "A graph record of a run journal (no id: it moves no cursor)."),
            ],
        }),
    );
    out.insert(
        "TenantStreamFrame".to_owned(),
        json!({
            "description": "One server-sent event of GET /v1/events, as a client parses it: `event` (absent for authority and watch events), `id` and `data` (JSON).",
            "oneOf": [
                capabilities,
                frame("replay-gap", None, "ReplayGap", "Retention forgot part of the range asked for (no id)."),
                authority,
                watch,
            ],
        }),
    );
    out
}

/// A proposed authority event: one of `AuthorityEvent` without the
/// sequences the journal assigns. The event schemas require them, so the
/// proposal is described by what differs, with its type among theirs.
fn proposed_event() -> Value {
    let types: Vec<&str> = SCHEMA_FILES
        .iter()
        .filter_map(|(path, _)| path.strip_prefix("events/")?.strip_suffix(".json"))
        .collect();
    json!({
        "description": "An authority event (AuthorityEvent, schema/events/) without `sessionSequence`, `sequence` and `workflowSequence`, which the journal assigns; `sessionId` (the path's) and `timestamp` (now) are filled in when absent. Its eventId makes a retry of the same body idempotent.",
        "type": "object",
        "required": ["protocolVersion", "type", "eventId"],
        "properties": {
            "protocolVersion": { "$ref": format!("{COMPONENTS}defs.protocolVersion") },
            "type": { "enum": types },
            "eventId": { "$ref": format!("{COMPONENTS}defs.id") },
            "sessionId": { "$ref": format!("{COMPONENTS}defs.id") },
            "timestamp": { "$ref": format!("{COMPONENTS}defs.timestamp") },
            "sessionSequence": false,
            "sequence": false,
            "workflowSequence": false,
        },
    })
}

/// One kind of server-sent event: its `event` name, whether it has an id,
/// and the schema of its data.
fn frame(event: &str, id: Option<&str>, data: &str, description: &str) -> Value {
    let mut properties = json!({
        "event": { "const": event },
        "data": { "$ref": format!("{COMPONENTS}{data}") },
    });
    let mut required = vec!["event", "data"];
    match id {
        Some(id_description) => {
            properties["id"] =
                json!({ "$ref": format!("{COMPONENTS}defs.id"), "description": id_description });
            required.push("id");
        }
        None => properties["id"] = json!(false),
    }
    json!({
        "description": description,
        "type": "object",
        "required": required,
        "properties": properties,
    })
}

/// `Error`: the envelope of `schema/documents/error.json`, with `code`
/// one of the catalog's.
fn error_component() -> Value {
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.code()).collect();
    let catalog: Vec<String> = ErrorCode::ALL
        .iter()
        .map(|c| format!("{} ({}): {}", c.code(), c.status(), c.title()))
        .collect();
    json!({
        "title": "Error",
        "description": "The answer of every request that does not succeed (docs/errors.md).",
        "allOf": [{ "$ref": format!("{COMPONENTS}documents.error") }],
        "properties": {
            "code": {
                "enum": codes,
                "description": format!("The catalog: {}.", catalog.join("; ")),
            },
        },
    })
}

/// Adds the statuses every operation of its kind can answer, and the
/// `Error` envelope to every error answer.
fn complete_operation(op: &mut Value) {
    let parameters = op.get_mut("parameters").and_then(Value::as_array_mut);
    for parameter in parameters.into_iter().flatten() {
        if let Some(types) = parameter["schema"]["type"].as_array() {
            let types: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
            parameter["schema"]["type"] = match types.as_slice() {
                [one] => one.clone(),
                _ => Value::Array(types),
            };
        }
    }
    let secured = op["security"].as_array().is_some_and(|s| {
        s.iter()
            .any(|r| r.as_object().is_some_and(|r| !r.is_empty()))
    });
    let has_body = op.get("requestBody").is_some();
    let has_parameters = op["parameters"].as_array().is_some_and(|p| !p.is_empty());
    let responses = op["responses"]
        .as_object_mut()
        .expect("every operation has responses");
    let mut add = |status: &str, description: &str| {
        responses
            .entry(status)
            .or_insert_with(|| json!({ "description": description }));
    };
    if has_body {
        add(
            "400",
            "NRD-0002: the body is not JSON; NRD-0003: it lacks the structure its type requires (`fields` points at the problem)",
        );
        add("413", "NRD-0006: the body exceeds the server's limit");
    }
    if has_parameters {
        add(
            "400",
            "NRD-0008: a parameter is missing or malformed (`fields` names it)",
        );
    }
    if secured {
        add("401", "NRD-0101: no valid credential");
        add(
            "403",
            "NRD-0102: the credential's role lacks the permission",
        );
        add(
            "500",
            "NRD-0001: the server failed; report the x-request-id",
        );
        add(
            "503",
            "NRD-0901: the database cannot be reached; retry with backoff",
        );
    }
    for (status, response) in responses.iter_mut() {
        let is_error = status.starts_with('4') || status.starts_with('5');
        if is_error && response.get("content").is_none() {
            response["content"] = json!({
                "application/json": { "schema": { "$ref": format!("{COMPONENTS}{ERROR}") } }
            });
        }
    }
}
