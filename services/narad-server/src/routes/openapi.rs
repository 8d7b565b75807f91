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
//!   discriminator; and the SSE frames of the two streams, whose `data` is
//!   JSON text with a `contentSchema` (the `session-erased` notice, which
//!   is no wire type of `schema/`, among them).
//! - **Proposals**: `proposed.<type>` for every event, made from its wire
//!   component with the envelopes' assigned sequences no longer required
//!   (and forbidden), and their union `ProposedEvent`.
//! - **`Error`**, the envelope of `schema/documents/error.json` with `code`
//!   narrowed to the catalog of [`ErrorCode`].
//! - **Error answers.** Every 4xx or 5xx an operation declares answers the
//!   `Error` envelope. Statuses that every operation of a kind can answer
//!   are added here once rather than on each route: 401, 403, 500 and 503
//!   on every operation that takes a credential; 400 and 413 on every one
//!   with a request body; 400 on every one with parameters.
//! - **Parameters are never null**: an absent one is left out, and text
//!   cannot be `null` in a path, query or header (utoipa makes optional
//!   headers nullable). Path parameters are ids (`defs.id`), but an
//!   extension's publisher and name.
//! - **Links** ([`LINKS`]) from the answers that name something to the
//!   operations that take it.
//! - **Required bodies.** A request body is required, but for the
//!   operations of [`OPTIONAL_BODIES`], which read an empty body as `{}`
//!   (utoipa marks a body given by `ref(...)` neither way).
//! - **Text holds no U+0000** ([`refuse_u0000`]): Postgres cannot store
//!   it, so the server refuses it in any string or object key of a body,
//!   parameter or header (400), and never answers it. Every schema says
//!   so, for validators, generated clients and fuzzers alike: a string
//!   has the pattern [`NO_U0000`] (beside its own, under `allOf`, when
//!   its own lets U+0000 through); an object's keys have it
//!   (`propertyNames`), and its members no schema names must not hold it
//!   (`unevaluatedProperties`); a free-form value (`true`, or a schema of
//!   annotations only) must not hold it at any depth (`not` the
//!   [`HOLDS_U0000`] component). The files of `schema/` are the protocol's
//!   and say nothing of it: the rule is this server's, added here. The
//!   error envelope is the exception ([`QUOTES_INPUT`]): its `message` and
//!   `fields` name the refused text's JSON pointer, which may hold U+0000.

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
        for (path, item) in paths.iter_mut() {
            let names_session = path.contains("{sessionId}");
            for (method, op) in item.as_object_mut().into_iter().flatten() {
                if !is_method(method) {
                    continue;
                }
                if op.get("requestBody").is_some() {
                    let optional = body_is_optional(&op["operationId"]);
                    optional_bodies += usize::from(optional);
                    op["requestBody"]["required"] = json!(!optional);
                }
                crate::idempotency::document(op);
                complete_operation(op, names_session);
            }
        }
    }
    assert_eq!(
        optional_bodies,
        OPTIONAL_BODIES.len(),
        "every operation of OPTIONAL_BODIES exists and takes a body"
    );
    add_links(&mut doc);
    refuse_u0000(&mut doc);
    doc
}

/// The pattern of text narad can store: no U+0000.
pub const NO_U0000: &str = "^[^\\u0000]*$";

/// The component of a JSON value holding U+0000 in a string or an object
/// key, at any depth: a free-form value is `not` it.
pub const HOLDS_U0000: &str = "HoldsU0000";

/// Keywords that assert nothing: a schema of these only (or `true`)
/// admits any JSON value.
const ANNOTATIONS: &[&str] = &[
    "description",
    "title",
    "examples",
    "example",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
];

/// Keywords whose value is one subschema that must hold as well (the rule
/// may be added inside them). `not`, `if`, `contains` and
/// `propertyNames` are left as they are: a rule added inside `not` would
/// loosen it.
const SUBSCHEMA: &[&str] = &[
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "then",
    "else",
    "contentSchema",
];

/// Keywords whose value is an array or a map of subschemas.
const SUBSCHEMAS: &[&str] = &[
    "allOf",
    "anyOf",
    "oneOf",
    "prefixItems",
    "properties",
    "patternProperties",
    "dependentSchemas",
    "$defs",
];

/// The components left without the rule: the error envelope, whose
/// `message` and `fields` quote the pointer of what was refused (a key
/// holding U+0000 among what it may name).
pub const QUOTES_INPUT: &[&str] = &[ERROR, "documents.error"];

/// States "no U+0000" in every schema of the document: components,
/// parameters and JSON bodies (see the module's documentation).
pub fn refuse_u0000(doc: &mut Value) {
    if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
        for (name, schema) in schemas.iter_mut() {
            if !QUOTES_INPUT.contains(&name.as_str()) {
                text_rule(schema);
            }
        }
        schemas.insert(HOLDS_U0000.to_owned(), holds_u0000());
    }
    for item in doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.values_mut())
    {
        for (method, op) in item.as_object_mut().into_iter().flatten() {
            if !is_method(method) {
                continue;
            }
            for (key, value) in op.as_object_mut().into_iter().flatten() {
                let media: Vec<&mut Value> = match key.as_str() {
                    "parameters" => {
                        for parameter in value.as_array_mut().into_iter().flatten() {
                            if let Some(schema) = parameter.get_mut("schema") {
                                text_rule(schema);
                            }
                        }
                        continue;
                    }
                    "requestBody" => vec![value],
                    "responses" => value
                        .as_object_mut()
                        .into_iter()
                        .flat_map(|r| r.values_mut())
                        .collect(),
                    _ => continue,
                };
                for body in media {
                    if let Some(schema) = body
                        .get_mut("content")
                        .and_then(|c| c.get_mut("application/json"))
                        .and_then(|m| m.get_mut("schema"))
                    {
                        text_rule(schema);
                    }
                }
            }
        }
    }
}

/// [`HOLDS_U0000`]: a string holding U+0000, an array with an item that
/// holds it, an object with a key or a member that holds it.
fn holds_u0000() -> Value {
    let this = json!({ "$ref": format!("{COMPONENTS}{HOLDS_U0000}") });
    json!({
        "description": "A JSON value holding U+0000 in a string or an object key, at any depth: what narad refuses (Postgres cannot store it). Free-form values are `not` this.",
        "anyOf": [
            { "type": "string", "pattern": "\\u0000" },
            { "type": "array", "contains": this },
            { "type": "object", "not": { "propertyNames": { "not": { "pattern": "\\u0000" } } } },
            { "type": "object", "not": { "additionalProperties": { "not": this } } },
        ],
    })
}

/// Adds the rule to `schema` and to the subschemas that must hold with it.
fn text_rule(schema: &mut Value) {
    if schema == &Value::Bool(true) {
        *schema = json!({ "not": { "$ref": format!("{COMPONENTS}{HOLDS_U0000}") } });
        return;
    }
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    for key in SUBSCHEMA {
        if let Some(sub) = map.get_mut(*key) {
            text_rule(sub);
        }
    }
    for key in SUBSCHEMAS {
        match map.get_mut(*key) {
            Some(Value::Array(subs)) => subs.iter_mut().for_each(text_rule),
            Some(Value::Object(subs)) => subs.values_mut().for_each(text_rule),
            _ => {}
        }
    }
    if map
        .keys()
        .all(|k| ANNOTATIONS.contains(&k.as_str()) || k.starts_with("x-"))
    {
        map.insert(
            "not".to_owned(),
            json!({ "$ref": format!("{COMPONENTS}{HOLDS_U0000}") }),
        );
        return;
    }
    let types: Vec<&str> = match &map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let is_string = types.contains(&"string");
    let is_object = types.contains(&"object") || map.contains_key("properties");
    if is_string {
        match map.get("pattern").and_then(Value::as_str) {
            None => {
                map.insert("pattern".to_owned(), json!(NO_U0000));
            }
            Some(own) if admits_u0000(own) => {
                let all_of = map.entry("allOf").or_insert_with(|| json!([]));
                if let Some(all_of) = all_of.as_array_mut() {
                    all_of.push(json!({ "pattern": NO_U0000 }));
                }
            }
            Some(_) => {}
        }
    }
    if is_object && map.get("additionalProperties") != Some(&Value::Bool(false)) {
        map.entry("propertyNames")
            .or_insert_with(|| json!({ "pattern": NO_U0000 }));
        if !map.contains_key("additionalProperties") {
            map.entry("unevaluatedProperties").or_insert_with(
                || json!({ "not": { "$ref": format!("{COMPONENTS}{HOLDS_U0000}") } }),
            );
        }
    }
}

/// Whether a regular expression (ECMAScript, as JSON Schema reads it) may
/// match a string holding U+0000: it has a `.`, a negated class that does
/// not name U+0000, or an escape that stands for it. Conservative: a
/// pattern it cannot read is taken to admit it.
pub fn admits_u0000(pattern: &str) -> bool {
    let mut chars = pattern.chars().peekable();
    let mut class: Option<(bool, String)> = None;
    while let Some(c) = chars.next() {
        match (&mut class, c) {
            (None, '\\') => match chars.next() {
                Some('D' | 'W' | 'S' | '0') => return true,
                Some(escape @ ('u' | 'x')) => {
                    let digits = if escape == 'u' { 4 } else { 2 };
                    if chars.clone().take(digits).filter(|d| *d == '0').count() == digits {
                        return true;
                    }
                }
                Some(_) => {}
                None => return true,
            },
            (None, '.') => return true,
            (None, '[') => {
                let negated = chars.peek() == Some(&'^');
                if negated {
                    chars.next();
                }
                class = Some((negated, String::new()));
            }
            (None, _) => {}
            (Some((negated, body)), ']') => {
                let names_it = body.contains("\\u0000") || body.contains("\\x00");
                if *negated != names_it {
                    return true;
                }
                class = None;
            }
            (Some((_, body)), '\\') => {
                body.push(c);
                if let Some(next) = chars.next() {
                    body.push(next);
                }
            }
            (Some((_, body)), _) => body.push(c),
        }
    }
    class.is_some()
}

/// One link: its name, the operation it leads to, and that operation's
/// path parameters as runtime expressions (`$response.body#/sessionId`).
pub type Link = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The links between operations (OpenAPI's `links`): what an answer names
/// that another operation takes. A client (or a stateful test) follows
/// them: `operation`, `status`, then each link's name, target operation
/// and `parameter = runtime expression` pairs.
pub const LINKS: &[(&str, &str, &[Link])] = &[
    (
        "createSession",
        "201",
        &[
            (
                "GetSession",
                "getSession",
                &[("sessionId", "$response.body#/sessionId")],
            ),
            (
                "ReadHistory",
                "readHistory",
                &[("sessionId", "$response.body#/sessionId")],
            ),
            (
                "AppendEvents",
                "appendEvents",
                &[("sessionId", "$response.body#/sessionId")],
            ),
            (
                "GetSessionDocuments",
                "getSessionDocuments",
                &[("sessionId", "$response.body#/sessionId")],
            ),
            (
                "ListQueuedStarts",
                "listQueuedStarts",
                &[("sessionId", "$response.body#/sessionId")],
            ),
        ],
    ),
    (
        "appendEvents",
        "201",
        &[(
            "ReadHistoryAfterAppend",
            "readHistory",
            &[("sessionId", "$request.path.sessionId")],
        )],
    ),
    (
        "claimRun",
        "200",
        &[
            (
                "RenewRuntimeLease",
                "renewRuntimeLease",
                &[("leaseId", "$response.body#/lease/leaseId")],
            ),
            (
                "PollRuntimeControls",
                "pollRuntimeControls",
                &[("leaseId", "$response.body#/lease/leaseId")],
            ),
            (
                "ReleaseRun",
                "releaseRun",
                &[("leaseId", "$response.body#/lease/leaseId")],
            ),
        ],
    ),
    (
        "registerExtension",
        "201",
        &[(
            "UpdateExtension",
            "updateExtension",
            &[
                ("publisher", "$response.body#/publisher"),
                ("name", "$response.body#/name"),
            ],
        )],
    ),
];

/// Adds [`LINKS`] to the answers they start from.
fn add_links(doc: &mut Value) {
    let mut answers: BTreeMap<String, &mut Value> = BTreeMap::new();
    for item in doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.values_mut())
    {
        for (method, op) in item.as_object_mut().into_iter().flatten() {
            if is_method(method) {
                let id = op["operationId"].as_str().unwrap_or_default().to_owned();
                answers.insert(id, &mut op["responses"]);
            }
        }
    }
    for (from, status, links) in LINKS {
        let responses = answers
            .get_mut(*from)
            .unwrap_or_else(|| panic!("a link starts from {from}, which is no operation"));
        let answer = responses.get_mut(*status).unwrap_or_else(|| {
            panic!("a link starts from {from} {status}, which it never answers")
        });
        let mut map = Map::new();
        for (name, to, parameters) in *links {
            let parameters: Map<String, Value> = parameters
                .iter()
                .map(|(p, expression)| ((*p).to_owned(), json!(expression)))
                .collect();
            map.insert(
                (*name).to_owned(),
                json!({ "operationId": to, "parameters": parameters }),
            );
        }
        answer["links"] = Value::Object(map);
    }
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

/// The union of the wire components of one folder of `schema/` (or, for
/// [`PROPOSED`], of the proposed forms of `events/`), with the wire `type`
/// as its discriminator.
fn union_of(folder: &str, description: &str) -> Value {
    let (files, prefix) = if folder == PROPOSED {
        ("events", PROPOSED)
    } else {
        (folder, folder)
    };
    let members: Vec<(String, String)> = SCHEMA_FILES
        .iter()
        .filter_map(|(path, _)| {
            let rest = path.strip_prefix(files)?.strip_prefix('/')?;
            let wire_type = rest.strip_suffix(".json")?;
            Some((wire_type.to_owned(), format!("{prefix}.{wire_type}")))
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
    out.extend(proposed_components());
    out.insert(
        "ProposedEvent".to_owned(),
        union_of(
            PROPOSED,
            "A proposed authority event: any type of schema/events/ without `sessionSequence`, `sequence` and `workflowSequence`, which the journal assigns; `sessionId` (the path's) and `timestamp` (now) are filled in when absent. Its eventId makes a retry of the same body idempotent.",
        ),
    );
    out.insert("TicketRequest".to_owned(), super::tickets::request_schema());
    out.extend(super::ai_sdk_ui::components());
    out.extend(super::ag_ui::schemas());
    out.insert(
        "HttpToolFinish".to_owned(),
        json!({
            "description": "`client.tool.finish` as sent over HTTP: it names the lease its execution token was delivered under (on the socket, the socket's lease is implied).",
            "allOf": [{ "$ref": format!("{COMPONENTS}control.client.tool.finish") }],
            "required": ["leaseId"],
        }),
    );
    out.insert(
        "ActiveExecution".to_owned(),
        json!({
            "description": "A session's active top-level execution (§3.1): an independent run or a workflow.",
            "oneOf": [
                {
                    "type": "object",
                    "required": ["kind", "runId"],
                    "properties": {
                        "kind": { "const": "run" },
                        "runId": { "$ref": format!("{COMPONENTS}defs.id") },
                    },
                    "additionalProperties": false,
                },
                {
                    "type": "object",
                    "required": ["kind", "workflowId"],
                    "properties": {
                        "kind": { "const": "workflow" },
                        "workflowId": { "$ref": format!("{COMPONENTS}defs.id") },
                    },
                    "additionalProperties": false,
                },
            ],
        }),
    );
    out.insert(
        "OpenApiDocument".to_owned(),
        json!({
            "description": "An OpenAPI 3.1 document (https://spec.openapis.org/oas/v3.1.0): this one.",
            "type": "object",
            "required": ["openapi", "info", "paths", "components"],
            "properties": {
                "openapi": { "type": "string", "pattern": "^3\\.1\\.\\d+$" },
                "info": { "type": "object", "additionalProperties": true },
                "paths": { "type": "object", "additionalProperties": true },
                "components": { "type": "object", "additionalProperties": true },
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
    out.insert(
        "SessionErasedNotice".to_owned(),
        json!({
            "description": "The data of a `session-erased` frame, on the erased session's stream (its last frame: the stream ends after it) and on its organisation's tenant streams: the session was erased (DELETE /v1/sessions/{sessionId}, a retention policy or the organisation's erasure). It carries nothing of the session's content; the session answers 410 NRD-0208 from now on. Shaped as a watch event, but not one of schema/watch/: a reader that does not know it passes over the named frame.",
            "type": "object",
            "allOf": [{ "$ref": format!("{COMPONENTS}envelopes.watch") }],
            "required": ["type", "workspaceId", "sessionId"],
            "properties": {
                "type": { "const": "session.erased" },
                "workspaceId": { "$ref": format!("{COMPONENTS}defs.id") },
                "sessionId": { "$ref": format!("{COMPONENTS}defs.id") },
            },
        }),
    );
    let erased = frame(
        "session-erased",
        Some("The notice's eventId: resume after it with Last-Event-ID."),
        "SessionErasedNotice",
        "A session was erased: its id, nothing of its content.",
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
                erased.clone(),
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
                erased,
            ],
        }),
    );
    out
}

/// The prefix of the proposed forms of the events: `proposed.run.started`
/// is `events.run.started` as a client proposes it.
pub const PROPOSED: &str = "proposed";

/// The fields the journal assigns: a proposal leaves them out.
pub const ASSIGNED: [&str; 3] = ["sessionSequence", "sequence", "workflowSequence"];

/// The fields the journal fills in when a proposal leaves them out.
pub const FILLED: [&str; 2] = ["sessionId", "timestamp"];

/// The envelopes that require an assigned or filled field.
pub const ENVELOPES_WITH_POSITIONS: [&str; 3] = ["authority", "runTree", "workflow"];

/// The proposed forms of the events, made from the wire components rather
/// than written again: each envelope of [`ENVELOPES_WITH_POSITIONS`] with
/// [`ASSIGNED`] and [`FILLED`] no longer required (`proposed.envelopes.*`),
/// and each event with its envelopes pointed at those and the assigned
/// fields taken out of its examples (`proposed.<type>`).
pub fn proposed_components() -> BTreeMap<String, Value> {
    let wire = wire_components();
    let mut out = BTreeMap::new();
    for envelope in ENVELOPES_WITH_POSITIONS {
        let mut schema = wire[&format!("envelopes.{envelope}")].clone();
        if let Some(required) = schema["required"].as_array_mut() {
            required.retain(|r| {
                r.as_str()
                    .is_none_or(|r| !ASSIGNED.contains(&r) && !FILLED.contains(&r))
            });
        }
        if let Some(dependent) = schema
            .get_mut("dependentRequired")
            .and_then(Value::as_object_mut)
        {
            dependent.retain(|field, _| !ASSIGNED.contains(&field.as_str()));
            for needs in dependent.values_mut().filter_map(Value::as_array_mut) {
                needs.retain(|r| r.as_str().is_none_or(|r| !ASSIGNED.contains(&r)));
            }
            dependent.retain(|_, needs| needs.as_array().is_none_or(|n| !n.is_empty()));
        }
        if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            for field in ASSIGNED {
                if properties.contains_key(field) {
                    properties.insert(field.to_owned(), Value::Bool(false));
                }
            }
        }
        schema["description"] = json!(format!(
            "As proposed (the journal assigns the sequences): {}",
            schema["description"].as_str().unwrap_or_default()
        ));
        out.insert(format!("{PROPOSED}.envelopes.{envelope}"), schema);
    }
    for (name, schema) in wire {
        let Some(wire_type) = name.strip_prefix("events.") else {
            continue;
        };
        let mut schema = schema.clone();
        point_envelopes_at_proposed(&mut schema);
        // The envelope's positions that travel together, said again where
        // the event's own members are: generators that build an object
        // from its `properties` overlook a `dependentRequired` inside
        // `allOf` (schemathesis' coverage phase did).
        schema["dependentRequired"] =
            out[&format!("{PROPOSED}.envelopes.authority")]["dependentRequired"].clone();
        if let Some(examples) = schema.get_mut("examples").and_then(Value::as_array_mut) {
            for example in examples.iter_mut().filter_map(Value::as_object_mut) {
                for field in ASSIGNED {
                    example.remove(field);
                }
            }
        }
        schema["title"] = json!(format!("proposed {wire_type}"));
        out.insert(format!("{PROPOSED}.{wire_type}"), schema);
    }
    out
}

/// Points the `$ref`s of `schema` at the envelopes of
/// [`ENVELOPES_WITH_POSITIONS`] to their proposed forms.
fn point_envelopes_at_proposed(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(target) if key == "$ref" => {
                        if let Some(envelope) = target
                            .strip_prefix(COMPONENTS)
                            .and_then(|n| n.strip_prefix("envelopes."))
                            .filter(|e| ENVELOPES_WITH_POSITIONS.contains(e))
                        {
                            *target = format!("{COMPONENTS}{PROPOSED}.envelopes.{envelope}");
                        }
                    }
                    _ => point_envelopes_at_proposed(value),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(point_envelopes_at_proposed),
        _ => {}
    }
}

/// One kind of server-sent event: its `event` name, whether it has an id,
/// and the schema of its data. As a client's SSE parser sees a frame, its
/// data is text: the JSON it holds is the `contentSchema` (OpenAPI 3.2's
/// way of describing event streams).
pub(crate) fn frame(event: &str, id: Option<&str>, data: &str, description: &str) -> Value {
    let mut properties = json!({
        "event": { "const": event },
        "data": {
            "description": "The frame's `data:` lines: one JSON document.",
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": { "$ref": format!("{COMPONENTS}{data}") },
        },
    });
    let mut required = vec!["event", "data"];
    match id {
        Some(id_description) => {
            properties["id"] =
                json!({ "$ref": format!("{COMPONENTS}defs.id"), "description": id_description });
            required.push("id");
        }
        // No `id:` line: an SSE parser reports the last id it saw (the
        // "last event ID buffer"), which this frame leaves as it was.
        None => {
            properties["id"] = json!({
                "$ref": format!("{COMPONENTS}defs.id"),
                "description": "Not sent with this frame: an SSE parser reports the last id it saw, which this frame does not move.",
            })
        }
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

/// The schema of a path parameter: an extension's `publisher` and `name`
/// are short names; every other one is an id (`defs.id`).
fn path_parameter(name: &str) -> Value {
    match name {
        "publisher" | "name" => json!({ "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$" }),
        _ => json!({ "$ref": format!("{COMPONENTS}defs.id") }),
    }
}

/// The tenant limit an operation answers 429 for, described.
fn limit_of(operation_id: &str) -> Option<&'static str> {
    const COMMAND: &str = "NRD-0602: the organisation's command rate (commandsPerSecond) is spent; retry after Retry-After";
    match operation_id {
        "appendEvents" => Some(
            "NRD-0601: the organisation's event rate (eventsPerSecond) is spent; nothing was written; retry the same batch after Retry-After",
        ),
        "createSession" | "createSessionCommand" => Some(
            "NRD-0602: the command rate is spent; NRD-0605: the organisation holds as many sessions as it may (sessions)",
        ),
        "streamSession" | "streamTenantEvents" => Some(
            "NRD-0603: the organisation has as many streams open as it may (openStreams); refused at open, open streams are never cut",
        ),
        "attachExecutor" | "connectExecutor" => Some(
            "NRD-0604: the organisation has as many client executors attached as it may (attachedExecutors)",
        ),
        "archiveSession"
        | "cancelWorkflow"
        | "recordUserMessage"
        | "redactMessage"
        | "resolveInterrupt"
        | "resolveInterruptAtSpecPath"
        | "startRun"
        | "startWorkflow"
        | "stopRun"
        | "updateSession" => Some(COMMAND),
        _ => None,
    }
}

/// Adds the statuses every operation of its kind can answer, and the
/// `Error` envelope to every error answer.
fn complete_operation(op: &mut Value, names_session: bool) {
    let parameters = op.get_mut("parameters").and_then(Value::as_array_mut);
    for parameter in parameters.into_iter().flatten() {
        if parameter["in"] == "path" && parameter["schema"] == json!({ "type": "string" }) {
            parameter["schema"] = path_parameter(parameter["name"].as_str().unwrap_or_default());
        }
        let name = parameter["name"].as_str().unwrap_or_default();
        if parameter["in"] == "header" && crate::input::TEXT_HEADERS.contains(&name) {
            parameter["schema"]["pattern"] = json!(crate::input::TEXT_HEADER_PATTERN);
        }
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
    let limited = limit_of(op["operationId"].as_str().unwrap_or_default());
    let reads_session = names_session
        || op["tags"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("commands")))
        || matches!(
            op["operationId"].as_str(),
            Some("streamTenantEvents" | "createStreamTicket" | "createSession" | "getCapabilities")
        );
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
    // Every credential of an organisation whose erasure was asked for is
    // refused; a route that reads a session is also refused for an erased
    // session.
    let closed = "NRD-0210: the organisation is being erased, or was: its credentials are refused";
    let erased =
        "NRD-0208: the session was erased; nothing of it is kept, and its id cannot be used again";
    match (secured, reads_session) {
        (true, true) => add("410", &format!("{erased}; {closed}")),
        (true, false) => add("410", closed),
        (false, true) => add("410", erased),
        (false, false) => {}
    }
    if let Some(description) = limited {
        responses.entry("429").or_insert_with(|| {
            json!({
                "description": description,
                "headers": {"Retry-After": {
                    "description": "Seconds to wait before sending the request again",
                    "schema": {"type": "integer", "minimum": 1}
                }}
            })
        });
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
