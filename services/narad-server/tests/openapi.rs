//! The OpenAPI document as a contract: stable operation ids, references
//! that resolve, typed bodies, the wire schemas of `schema/` as they are on
//! disk, the error envelope on every error answer, and the bounds the
//! server enforces. No server or database: the document is built from the
//! routes, as `GET /openapi.json` and `narad openapi` build it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use narad_protocol::ErrorCode;
use narad_protocol::commands::Command;
use narad_server::routes::openapi::{
    HOLDS_U0000, NO_U0000, OPTIONAL_BODIES, QUOTES_INPUT, admits_u0000, document,
};
use serde_json::Value;

/// Every operation, with the id clients are generated with. Changing an id
/// breaks every generated client: add an operation here, never rename one.
const OPERATIONS: &[(&str, &str, &str)] = &[
    ("get", "/healthz", "checkHealth"),
    ("get", "/metrics", "getMetrics"),
    ("get", "/readyz", "checkReadiness"),
    ("get", "/openapi.json", "getOpenApiDocument"),
    ("get", "/v1/capabilities", "getCapabilities"),
    ("post", "/v1/stream-tickets", "createStreamTicket"),
    ("post", "/v1/sessions", "createSession"),
    ("get", "/v1/sessions", "listSessions"),
    ("get", "/v1/sessions/{sessionId}", "getSession"),
    (
        "get",
        "/v1/sessions/{sessionId}/documents",
        "getSessionDocuments",
    ),
    (
        "get",
        "/v1/sessions/{sessionId}/queued-starts",
        "listQueuedStarts",
    ),
    (
        "delete",
        "/v1/sessions/{sessionId}/queued-starts/{queueId}",
        "withdrawQueuedStart",
    ),
    ("post", "/v1/sessions/{sessionId}/events", "appendEvents"),
    ("get", "/v1/sessions/{sessionId}/events", "readHistory"),
    ("get", "/v1/sessions/{sessionId}/stream", "streamSession"),
    ("get", "/v1/events", "streamTenantEvents"),
    (
        "post",
        "/v1/commands/create-session",
        "createSessionCommand",
    ),
    ("post", "/v1/commands/start-run", "startRun"),
    ("post", "/v1/commands/stop-run", "stopRun"),
    ("post", "/v1/commands/resolve-interrupt", "resolveInterrupt"),
    (
        "post",
        "/v1/commands/record-user-message",
        "recordUserMessage",
    ),
    ("post", "/v1/commands/start-workflow", "startWorkflow"),
    ("post", "/v1/commands/cancel-workflow", "cancelWorkflow"),
    ("post", "/v1/commands/redact-message", "redactMessage"),
    ("post", "/v1/commands/update-session", "updateSession"),
    ("post", "/v1/commands/archive-session", "archiveSession"),
    (
        "post",
        "/api/narad/v1/commands/resolve-interrupt",
        "resolveInterruptAtSpecPath",
    ),
    ("post", "/v1/extensions", "registerExtension"),
    ("get", "/v1/extensions", "listExtensions"),
    ("get", "/v1/interrupts", "listOpenInterrupts"),
    ("get", "/v1/operations", "getOperations"),
    ("get", "/v1/audit", "listAudit"),
    ("get", "/v1/search", "searchSessions"),
    ("get", "/v1/usage", "getUsage"),
    ("get", "/v1/admin/tenants/{org}/limits", "getTenantLimits"),
    ("put", "/v1/admin/tenants/{org}/limits", "setTenantLimits"),
    ("delete", "/v1/sessions/{sessionId}", "eraseSession"),
    ("delete", "/v1/admin/tenants/{org}", "eraseTenant"),
    ("get", "/v1/admin/tenants/{org}/erasure", "getTenantErasure"),
    (
        "get",
        "/v1/admin/tenants/{org}/retention",
        "previewRetention",
    ),
    ("post", "/v1/sessions/{sessionId}/blobs", "uploadBlob"),
    ("get", "/v1/blobs/{blobId}", "downloadBlob"),
    ("patch", "/v1/blobs/{blobId}", "resumeUpload"),
    ("get", "/v1/blobs/{blobId}/upload", "getUpload"),
    (
        "patch",
        "/v1/extensions/{publisher}/{name}",
        "updateExtension",
    ),
    (
        "get",
        "/v1/executors/{clientExecutorId}/connect",
        "connectExecutor",
    ),
    (
        "post",
        "/v1/executors/{clientExecutorId}/attach",
        "attachExecutor",
    ),
    (
        "post",
        "/v1/executors/{clientExecutorId}/heartbeat",
        "renewExecutorLease",
    ),
    (
        "post",
        "/v1/executors/{clientExecutorId}/finish",
        "finishClientToolCall",
    ),
    (
        "get",
        "/v1/executors/{clientExecutorId}/controls",
        "pollExecutorControls",
    ),
    ("post", "/v1/ag-ui", "runAgUi"),
    ("post", "/v1/chat", "chat"),
    ("get", "/v1/chat/{sessionId}/stream", "resumeChat"),
    ("post", "/v1/runtime/claims", "claimRun"),
    (
        "post",
        "/v1/runtime/leases/{leaseId}/heartbeat",
        "renewRuntimeLease",
    ),
    ("post", "/v1/runtime/leases/{leaseId}/release", "releaseRun"),
    (
        "get",
        "/v1/runtime/leases/{leaseId}/controls",
        "pollRuntimeControls",
    ),
];

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Every operation of the document: (method, path, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if METHODS.contains(&method.as_str()) {
                out.push((method.clone(), path.clone(), op.clone()));
            }
        }
    }
    out
}

/// The target of a `$ref` of the document.
fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    doc.pointer(reference.strip_prefix('#')?)
}

/// `schema` with `$ref`s followed until one that is not a bare reference.
fn followed<'a>(doc: &'a Value, mut schema: &'a Value) -> &'a Value {
    while let Some(r) = schema["$ref"].as_str() {
        schema = resolve(doc, r).unwrap_or_else(|| panic!("{r} resolves"));
    }
    schema
}

fn operation<'a>(doc: &'a Value, id: &str) -> &'a Value {
    let (method, path, _) = OPERATIONS.iter().find(|o| o.2 == id).unwrap();
    &doc["paths"][path][method]
}

#[test]
fn operation_ids_are_unique_stable_and_camel_case() {
    let doc = document();
    let found: BTreeSet<(String, String, String)> = operations(&doc)
        .into_iter()
        .map(|(m, p, op)| (m, p, op["operationId"].as_str().unwrap().to_owned()))
        .collect();
    let expected: BTreeSet<(String, String, String)> = OPERATIONS
        .iter()
        .map(|(m, p, id)| (m.to_string(), p.to_string(), id.to_string()))
        .collect();
    assert_eq!(found, expected);
    let ids: HashSet<&str> = OPERATIONS.iter().map(|o| o.2).collect();
    assert_eq!(ids.len(), OPERATIONS.len(), "operationIds are unique");
    for id in ids {
        assert!(
            id.starts_with(|c: char| c.is_ascii_lowercase())
                && id.chars().all(|c| c.is_ascii_alphanumeric()),
            "{id} is camelCase"
        );
    }
}

#[test]
fn no_field_of_an_operation_is_null() {
    let doc = document();
    for (method, path, op) in operations(&doc) {
        for (key, value) in op.as_object().unwrap() {
            assert!(!value.is_null(), "{method} {path}: {key} is null");
        }
    }
}

#[test]
fn every_reference_resolves() {
    fn walk(doc: &Value, v: &Value, at: &str, broken: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, x) in map {
                    if k == "$ref" {
                        let r = x.as_str().unwrap();
                        if resolve(doc, r).is_none() {
                            broken.push(format!("{at}: {r}"));
                        }
                    } else {
                        walk(doc, x, &format!("{at}/{k}"), broken);
                    }
                }
            }
            Value::Array(items) => {
                for (i, x) in items.iter().enumerate() {
                    walk(doc, x, &format!("{at}/{i}"), broken);
                }
            }
            _ => {}
        }
    }
    let doc = document();
    let mut broken = Vec::new();
    walk(&doc, &doc, "", &mut broken);
    assert!(
        broken.is_empty(),
        "references that resolve to nothing: {broken:#?}"
    );
}

/// A schema that says nothing of its object: `{}`, or `{type: object}`
/// with at most a title and a description.
fn is_bare(schema: &Value) -> bool {
    schema.as_object().is_none_or(|s| {
        s.keys()
            .all(|k| ["type", "description", "title"].contains(&k.as_str()))
            && s.get("type").is_none_or(|t| t == "object")
    })
}

#[test]
fn every_body_and_every_successful_answer_is_typed() {
    let doc = document();
    let mut untyped = Vec::new();
    for (method, path, op) in operations(&doc) {
        let mut bodies: Vec<(String, &Value)> = Vec::new();
        if let Some(content) = op["requestBody"]["content"].as_object() {
            bodies.extend(content.values().map(|c| ("request".to_owned(), c)));
        }
        for (status, answer) in op["responses"].as_object().unwrap() {
            if status.starts_with('2')
                && let Some(content) = answer["content"].as_object()
            {
                bodies.extend(content.values().map(|c| (status.clone(), c)));
            }
        }
        for (what, content) in bodies {
            let schema = content.get("schema");
            if schema.is_none_or(|s| is_bare(followed(&doc, s))) {
                untyped.push(format!("{method} {path} {what}"));
            }
        }
    }
    assert!(untyped.is_empty(), "bodies without a schema: {untyped:#?}");
}

#[test]
fn every_json_answer_of_a_success_has_a_body_but_a_no_content() {
    let doc = document();
    for (method, path, op) in operations(&doc) {
        for (status, answer) in op["responses"].as_object().unwrap() {
            let empty = ["101", "204"].contains(&status.as_str());
            if status.starts_with('2') || status == "101" {
                assert_eq!(
                    answer.get("content").is_none(),
                    empty,
                    "{method} {path} {status}"
                );
            }
        }
    }
}

#[test]
fn request_bodies_are_required_where_an_empty_body_is_refused() {
    let doc = document();
    for (method, path, op) in operations(&doc) {
        let Some(body) = op.get("requestBody") else {
            continue;
        };
        let optional = OPTIONAL_BODIES.contains(&op["operationId"].as_str().unwrap());
        assert_eq!(body["required"], !optional, "{method} {path}");
        if optional {
            // An empty body is read as `{}`: so is `{}` itself, and no
            // member of its schema can be required.
            let target = body["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .unwrap();
            let name = target.strip_prefix("#/components/schemas/").unwrap();
            let schema = &doc["components"]["schemas"][name];
            assert!(
                schema["required"].as_array().is_none_or(|r| r.is_empty()),
                "{method} {path}: {name} requires {}",
                schema["required"]
            );
        }
    }
}

#[test]
fn every_command_has_a_route_of_its_own_with_its_schema() {
    let doc = document();
    for name in Command::NAMES {
        let op = &doc["paths"][format!("/v1/commands/{name}")]["post"];
        assert_eq!(
            op["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            format!("#/components/schemas/commands.{name}"),
            "{name}"
        );
    }
}

#[test]
fn every_error_answer_is_the_envelope_and_protected_routes_declare_401() {
    let doc = document();
    let error = Value::String("#/components/schemas/Error".to_owned());
    for (method, path, op) in operations(&doc) {
        let responses = op["responses"].as_object().unwrap();
        let protected = op["security"].as_array().is_some_and(|s| {
            s.iter()
                .any(|r| r.as_object().is_some_and(|r| !r.is_empty()))
        });
        if protected {
            for status in ["401", "403", "500", "503"] {
                assert!(
                    responses.contains_key(status),
                    "{method} {path} declares {status}"
                );
            }
        }
        if op.get("requestBody").is_some() {
            assert!(
                responses.contains_key("400"),
                "{method} {path} declares 400"
            );
            assert!(
                responses.contains_key("413"),
                "{method} {path} declares 413"
            );
        }
        for (status, answer) in responses {
            // Readiness answers its own document when not ready.
            if (status.starts_with('4') || status.starts_with('5')) && path != "/readyz" {
                assert_eq!(
                    answer["content"]["application/json"]["schema"]["$ref"], error,
                    "{method} {path} {status}"
                );
            }
        }
    }
}

#[test]
fn the_error_envelope_lists_the_catalog() {
    let doc = document();
    let schema = &doc["components"]["schemas"]["Error"];
    let codes: Vec<&str> = schema["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let catalog: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.code()).collect();
    assert_eq!(codes, catalog);
    assert_eq!(
        schema["allOf"][0]["$ref"], "#/components/schemas/documents.error",
        "the envelope is schema/documents/error.json"
    );
}

fn parameter<'a>(op: &'a Value, name: &str) -> &'a Value {
    op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("parameter {name}"))
}

#[test]
fn parameter_bounds_are_the_servers() {
    use narad_server::routes::{executors, runtime, sessions};
    let doc = document();
    let limit = &parameter(operation(&doc, "readHistory"), "limit")["schema"];
    assert_eq!(limit["minimum"], 1);
    assert_eq!(limit["maximum"], narad_journal::history::MAX_LIMIT);
    let limit = &parameter(operation(&doc, "listSessions"), "limit")["schema"];
    assert_eq!(limit["minimum"], 1);
    assert_eq!(limit["maximum"], sessions::SESSION_PAGE.1);
    for (id, most) in [
        ("pollExecutorControls", executors::MAX_POLL_WAIT_MS),
        ("pollRuntimeControls", runtime::MAX_POLL_WAIT_MS),
    ] {
        let wait = &parameter(operation(&doc, id), "waitMs")["schema"];
        assert_eq!(wait["minimum"], 0, "{id}");
        assert_eq!(wait["maximum"], most, "{id}");
    }
    let claim = followed(
        &doc,
        &operation(&doc, "claimRun")["requestBody"]["content"]["application/json"]["schema"],
    );
    assert_eq!(
        claim["properties"]["waitMs"]["maximum"],
        runtime::MAX_POLL_WAIT_MS
    );
    for id in ["readHistory", "streamSession"] {
        let cursor = &parameter(operation(&doc, id), "afterSessionSequence")["schema"];
        assert_eq!(cursor["maximum"], 9_007_199_254_740_991_u64, "{id}");
    }
    for (_, path, op) in operations(&doc) {
        for p in op["parameters"].as_array().into_iter().flatten() {
            let t = &p["schema"]["type"];
            assert!(
                t.as_array().is_none_or(|t| !t.contains(&"null".into())),
                "{path}: parameter {} is never null",
                p["name"]
            );
        }
    }
}

#[test]
fn headers_and_security_schemes_are_declared() {
    let doc = document();
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(schemes["bearer"]["bearerFormat"], "JWT");
    assert_eq!(schemes["extensionSignature"]["in"], "header");
    assert_eq!(schemes["extensionSignature"]["name"], "Narad-Signature");
    parameter(operation(&doc, "appendEvents"), "Narad-Runtime-Lease");
    for id in ["readHistory", "streamSession", "streamTenantEvents"] {
        let op = operation(&doc, id);
        assert!(
            op["security"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s.get("extensionSignature").is_some()),
            "{id} takes signed calls"
        );
        for header in ["Narad-Timestamp", "Narad-Request-Id", "Narad-Extension"] {
            assert_eq!(parameter(op, header)["in"], "header", "{id}: {header}");
        }
    }
    for id in ["streamSession", "streamTenantEvents"] {
        assert_eq!(
            parameter(operation(&doc, id), "Last-Event-ID")["in"],
            "header"
        );
    }
}

#[test]
fn streams_describe_their_frames() {
    let doc = document();
    for (id, frame, kinds) in [
        (
            "streamSession",
            "SessionStreamFrame",
            &["capabilities", "message", "hydrate", "session-erased"][..],
        ),
        (
            "streamTenantEvents",
            "TenantStreamFrame",
            &["capabilities", "replay-gap", "message", "session-erased"][..],
        ),
    ] {
        let content = &operation(&doc, id)["responses"]["200"]["content"]["text/event-stream"];
        assert_eq!(
            content["schema"]["$ref"],
            format!("#/components/schemas/{frame}")
        );
        let named: BTreeSet<&str> = doc["components"]["schemas"][frame]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["properties"]["event"]["const"].as_str().unwrap())
            .collect();
        assert_eq!(named, kinds.iter().copied().collect(), "{id}");
        // An SSE parser hands over `data` as text; the JSON in it is the
        // contentSchema, a component that exists.
        for frame in doc["components"]["schemas"][frame]["oneOf"]
            .as_array()
            .unwrap()
        {
            let data = &frame["properties"]["data"];
            assert_eq!(data["type"], "string", "{id}");
            assert_eq!(data["contentMediaType"], "application/json", "{id}");
            let target = data["contentSchema"]["$ref"].as_str().unwrap();
            let name = target.strip_prefix("#/components/schemas/").unwrap();
            assert!(doc["components"]["schemas"].get(name).is_some(), "{target}");
        }
    }
    let socket = &operation(&doc, "connectExecutor")["x-websocket-messages"];
    assert_eq!(socket["server"].as_array().unwrap().len(), 3);
    assert_eq!(socket["client"].as_array().unwrap().len(), 2);
}

/// An SSE frame as a client's parser hands it over: `event` (`message`
/// when the frame names none), `id` when it has one, and `data` as text.
fn parsed_frame(frame: &[u8]) -> Value {
    let text = std::str::from_utf8(frame).unwrap();
    let mut parsed = serde_json::json!({ "event": "message" });
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (field, value) = line.split_once(": ").unwrap();
        parsed[field] = Value::from(value);
    }
    parsed
}

#[test]
fn the_session_erased_notice_is_a_frame_of_both_streams() {
    let doc = document();
    // What an erasure leaves on the streams (as the journal records it),
    // framed by the hub as it sends it.
    let notice = serde_json::json!({
        "protocolVersion": "narad/v1",
        "eventId": "w.session.erased.a.0",
        "type": "session.erased",
        "timestamp": "2026-12-02T10:00:00.000Z",
        "revision": 0,
        "workspaceId": "acme",
        "sessionId": "a",
    });
    let frame = parsed_frame(&narad_server::hub::frame("w.session.erased.a.0", &notice));
    assert_eq!(frame["event"], "session-erased", "{frame}");
    for stream in ["SessionStreamFrame", "TenantStreamFrame"] {
        let errors: Vec<String> = validator(&doc, stream)
            .iter_errors(&frame)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{stream}: {frame}: {errors:?}");
        let kind = doc["components"]["schemas"][stream]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["properties"]["event"]["const"] == "session-erased")
            .unwrap_or_else(|| panic!("{stream} has no session-erased frame"));
        // The data is the notice, and nothing else is: a frame's data of
        // another kind is refused.
        let content = kind["properties"]["data"]["contentSchema"]["$ref"]
            .as_str()
            .unwrap()
            .strip_prefix("#/components/schemas/")
            .unwrap();
        let data: Value = serde_json::from_str(frame["data"].as_str().unwrap()).unwrap();
        assert_eq!(data, notice);
        let errors: Vec<String> = validator(&doc, content)
            .iter_errors(&data)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{content}: {data}: {errors:?}");
        let mut other = data.clone();
        other["type"] = Value::from("session.archived");
        assert!(!validator(&doc, content).is_valid(&other), "{content}");
        // The id moves the cursor: a client resumes after it.
        assert!(
            kind["required"]
                .as_array()
                .unwrap()
                .contains(&Value::from("id"))
        );
    }
}

// ---- The wire components are the files of schema/ ----

fn schema_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema")
}

/// Every file of `schema/`, read from disk, by its path there.
fn files_on_disk() -> BTreeMap<String, Value> {
    fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<String, Value>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                collect(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "json") {
                let relative = path.strip_prefix(root).unwrap().to_str().unwrap();
                let text = std::fs::read_to_string(&path).unwrap();
                out.insert(
                    relative.replace('\\', "/"),
                    serde_json::from_str(&text).unwrap(),
                );
            }
        }
    }
    let root = schema_root();
    let mut out = BTreeMap::new();
    collect(&root, &root, &mut out);
    out
}

/// A `$ref` of a file, resolved among the files: (file, pointer, value).
fn resolve_in_files<'a>(
    files: &'a BTreeMap<String, Value>,
    from: &str,
    reference: &str,
) -> (String, String, &'a Value) {
    let (file, pointer) = reference.split_once('#').unwrap_or((reference, ""));
    let file = if file.is_empty() {
        from.to_owned()
    } else {
        let mut parts: Vec<&str> = from.split('/').collect();
        parts.pop();
        for segment in file.split('/') {
            match segment {
                ".." => {
                    parts.pop();
                }
                "." => {}
                s => parts.push(s),
            }
        }
        parts.join("/")
    };
    let value = files[&file]
        .pointer(pointer)
        .unwrap_or_else(|| panic!("schema/{from}: {reference} resolves"));
    (file, pointer.to_owned(), value)
}

/// Whether `component` (in the document) says what `schema` (in `file`)
/// says: equal, but for `$ref`s, which must lead to schemas that agree in
/// turn. Pairs of references already being compared are taken to agree
/// (the schemas may refer to themselves).
fn agree(
    doc: &Value,
    component: &Value,
    files: &BTreeMap<String, Value>,
    file: &str,
    schema: &Value,
    at: &str,
    seen: &mut HashSet<(String, String)>,
) -> Result<(), String> {
    match (component, schema) {
        (Value::Object(c), Value::Object(s)) => {
            let ck: BTreeSet<&String> = c.keys().collect();
            let sk: BTreeSet<&String> = s.keys().collect();
            if ck != sk {
                return Err(format!("{file}{at}: keys {ck:?} and {sk:?}"));
            }
            for (key, value) in s {
                if key == "$ref" {
                    let (target_file, pointer, target) =
                        resolve_in_files(files, file, value.as_str().unwrap());
                    let component_ref = c[key].as_str().unwrap();
                    let resolved = resolve(doc, component_ref)
                        .ok_or_else(|| format!("{file}{at}: {component_ref} resolves"))?;
                    let pair = (component_ref.to_owned(), format!("{target_file}#{pointer}"));
                    if seen.insert(pair) {
                        agree(doc, resolved, files, &target_file, target, &pointer, seen)?;
                    }
                } else {
                    agree(
                        doc,
                        &c[key],
                        files,
                        file,
                        value,
                        &format!("{at}/{key}"),
                        seen,
                    )?;
                }
            }
            Ok(())
        }
        (Value::Array(c), Value::Array(s)) if c.len() == s.len() => {
            for (i, (x, y)) in c.iter().zip(s).enumerate() {
                agree(doc, x, files, file, y, &format!("{at}/{i}"), seen)?;
            }
            Ok(())
        }
        (c, s) if c == s => Ok(()),
        // Two ways of saying "any value".
        (Value::Object(c), Value::Bool(true)) if c.is_empty() => Ok(()),
        (c, s) => Err(format!("{file}{at}: {c} in the document, {s} in the file")),
    }
}

#[test]
fn the_wire_components_are_the_files_of_schema() {
    // The document adds its rule on text (no U+0000): taken out, the rest
    // is the files'.
    let doc = without_text_rule(&document());
    let files = files_on_disk();
    assert!(files.len() > 80, "schema/ holds every wire type");
    let components = doc["components"]["schemas"].as_object().unwrap();
    let mut compared = 0;
    let mut seen = HashSet::new();
    for (path, file) in &files {
        let name = path.trim_end_matches(".json").replace('/', ".");
        let pairs: Vec<(String, String, &Value)> =
            if file.get("$defs").is_some() && file.get("type").is_none() {
                file["$defs"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(def, schema)| (format!("{name}.{def}"), format!("/$defs/{def}"), schema))
                    .collect()
            } else {
                vec![(name, String::new(), file)]
            };
        for (component, pointer, schema) in pairs {
            let Some(copy) = components.get(&component) else {
                panic!("schema/{path}{pointer} has no component {component}");
            };
            agree(&doc, copy, &files, path, schema, &pointer, &mut seen)
                .unwrap_or_else(|e| panic!("component {component}: {e}"));
            compared += 1;
        }
    }
    // Every dotted component (the wire's naming) came from a file, but the
    // proposed forms, made from them (checked by the proposal tests).
    let dotted = components
        .keys()
        .filter(|k| k.contains('.') && !k.starts_with("proposed."))
        .count();
    assert_eq!(dotted, compared, "no wire component without a file");
}

#[test]
fn the_unions_hold_every_type_of_their_folder() {
    let doc = document();
    let files = files_on_disk();
    for (union, folder) in [
        ("AuthorityEvent", "events/"),
        ("WatchEvent", "watch/"),
        ("HydrateRecord", "hydrate/"),
        ("ProposedEvent", "events/"),
    ] {
        let schema = &doc["components"]["schemas"][union];
        let members: BTreeSet<String> = schema["discriminator"]["mapping"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let types: BTreeSet<String> = files
            .iter()
            .filter(|(p, _)| p.starts_with(folder))
            .map(|(_, f)| {
                f["properties"]["type"]["const"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(members, types, "{union}");
        assert_eq!(schema["oneOf"].as_array().unwrap().len(), types.len());
    }
}

// ---- Proposals ----

/// A validator of `component` that resolves the document's references.
fn validator(doc: &Value, component: &str) -> jsonschema::Validator {
    let mut root = doc.clone();
    root["$ref"] = Value::from(format!("#/components/schemas/{component}"));
    jsonschema::draft202012::new(&root).unwrap()
}

#[test]
fn every_event_example_is_a_proposal_once_its_sequences_are_taken_out() {
    let doc = document();
    let proposed = validator(&doc, "ProposedEvent");
    let stored = validator(&doc, "AuthorityEvent");
    let mut seen = 0;
    for (path, file) in files_on_disk() {
        if !path.starts_with("events/") {
            continue;
        }
        for example in file["examples"].as_array().unwrap() {
            assert!(stored.is_valid(example), "{path}: {example}");
            // As stored, with its sequences, it is no proposal.
            assert!(!proposed.is_valid(example), "{path}: {example}");
            let mut proposal = example.clone();
            for assigned in ["sessionSequence", "sequence", "workflowSequence"] {
                proposal.as_object_mut().unwrap().remove(assigned);
            }
            let errors: Vec<String> = proposed
                .iter_errors(&proposal)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{path}: {proposal}: {errors:?}");
            // A proposal of one type is refused as another.
            proposal["type"] = Value::from(if example["type"] == "run.raw" {
                "session.raw"
            } else {
                "run.raw"
            });
            assert!(!proposed.is_valid(&proposal), "{path} as another type");
            seen += 1;
        }
    }
    assert!(seen >= 51, "only {seen} examples");
}

#[test]
fn links_name_operations_and_their_parameters() {
    let doc = document();
    let mut links = 0;
    for (method, path, op) in operations(&doc) {
        for (status, answer) in op["responses"].as_object().unwrap() {
            for (name, link) in answer["links"].as_object().into_iter().flatten() {
                let target = operation(&doc, link["operationId"].as_str().unwrap());
                for (parameter, expression) in link["parameters"].as_object().unwrap() {
                    assert!(
                        target["parameters"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|p| p["name"] == *parameter && p["in"] == "path"),
                        "{method} {path} {status} link {name}: {parameter} is no path parameter of the target"
                    );
                    let expression = expression.as_str().unwrap();
                    if let Some(pointer) = expression.strip_prefix("$response.body#") {
                        // The pointer names a member of the answer's schema.
                        let schema = &answer["content"]["application/json"]["schema"];
                        let mut at = resolve_ref(&doc, schema);
                        assert!(!at.is_null(), "{name}: the answer has a schema");
                        for segment in pointer.trim_start_matches('/').split('/') {
                            at = member(&doc, &at, segment);
                            assert!(!at.is_null(), "{name}: {expression}");
                        }
                    }
                    links += 1;
                }
            }
        }
    }
    assert!(links >= 10, "{links} link parameters");
}

/// The schema of member `name` of an object schema, through `allOf`.
fn member(doc: &Value, schema: &Value, name: &str) -> Value {
    let own = &schema["properties"][name];
    if !own.is_null() {
        return resolve_ref(doc, own);
    }
    schema["allOf"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|part| member(doc, &resolve_ref(doc, part), name))
        .find(|found| !found.is_null())
        .unwrap_or(Value::Null)
}

fn resolve_ref(doc: &Value, schema: &Value) -> Value {
    match schema["$ref"].as_str() {
        Some(target) => {
            let name = target.strip_prefix("#/components/schemas/").unwrap();
            doc["components"]["schemas"][name].clone()
        }
        None => schema.clone(),
    }
}

// ---- Text holds no U+0000 ----

/// `doc` without what `refuse_u0000` adds: the pattern, the key rule, the
/// rule on unnamed members, the free-form values' `not`, the component.
fn without_text_rule(doc: &Value) -> Value {
    let holds = serde_json::json!({ "$ref": format!("#/components/schemas/{HOLDS_U0000}") });
    let no = serde_json::json!({ "pattern": NO_U0000 });
    match doc {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                let added = match key.as_str() {
                    "pattern" => value == NO_U0000,
                    "propertyNames" => *value == no,
                    "unevaluatedProperties" => *value == serde_json::json!({ "not": holds }),
                    "not" => *value == holds,
                    HOLDS_U0000 => true,
                    _ => false,
                };
                if added {
                    continue;
                }
                let value = match (key.as_str(), value) {
                    ("allOf", Value::Array(parts)) => {
                        let parts: Vec<Value> = parts
                            .iter()
                            .filter(|p| **p != no)
                            .map(without_text_rule)
                            .collect();
                        if parts.is_empty() {
                            continue;
                        }
                        Value::Array(parts)
                    }
                    _ => without_text_rule(value),
                };
                out.insert(key.clone(), value);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(without_text_rule).collect()),
        other => other.clone(),
    }
}

/// Every pointer of `value` to a string, and to an object (the root too).
fn strings_and_objects(
    value: &Value,
    at: String,
    strings: &mut Vec<String>,
    objects: &mut Vec<String>,
) {
    match value {
        Value::String(_) => strings.push(at),
        Value::Object(map) => {
            objects.push(at.clone());
            for (key, member) in map {
                let key = key.replace('~', "~0").replace('/', "~1");
                strings_and_objects(member, format!("{at}/{key}"), strings, objects);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                strings_and_objects(item, format!("{at}/{i}"), strings, objects);
            }
        }
        _ => {}
    }
}

#[test]
fn text_holding_u0000_is_refused_by_every_wire_component() {
    let doc = document();
    let mut refused = 0;
    for (path, file) in files_on_disk() {
        let Some(examples) = file["examples"].as_array() else {
            continue;
        };
        let component = path.trim_end_matches(".json").replace('/', ".");
        if QUOTES_INPUT.contains(&component.as_str()) {
            continue;
        }
        let validator = validator(&doc, &component);
        for example in examples {
            assert!(validator.is_valid(example), "{path}: {example}");
            let (mut strings, mut objects) = (Vec::new(), Vec::new());
            strings_and_objects(example, String::new(), &mut strings, &mut objects);
            // A string holding it, wherever it is: an id, a text, a value
            // inside free-form JSON (`input`, `response`, `state`).
            for pointer in &strings {
                let mut broken = example.clone();
                let text = broken.pointer_mut(pointer).unwrap();
                *text = Value::from(format!("{}\u{0}", text.as_str().unwrap()));
                assert!(
                    !validator.is_valid(&broken),
                    "{path}: {pointer} holding U+0000"
                );
                refused += 1;
            }
            // A key holding it, and a member no schema names holding it.
            for pointer in &objects {
                for (key, value) in [
                    ("a\u{0}b", Value::from(1)),
                    ("unnamed", Value::from("a\u{0}b")),
                ] {
                    let mut broken = example.clone();
                    broken.pointer_mut(pointer).unwrap()[key] = value;
                    assert!(!validator.is_valid(&broken), "{path}: {pointer}/{key:?}");
                    refused += 1;
                }
            }
        }
    }
    assert!(refused > 800, "only {refused} cases");
    // The error envelope quotes the pointer of what it refused, which may
    // hold U+0000 (as the server answers it).
    let quoted = serde_json::json!({
        "code": "NRD-0003",
        "title": "Invalid object",
        "message": "/metadata/a\u{0}b: text holds U+0000, which narad cannot store; remove it",
        "fields": { "/metadata/a\u{0}b": "text holds U+0000, which narad cannot store; remove it" },
    });
    for component in QUOTES_INPUT {
        let errors: Vec<String> = validator(&doc, component)
            .iter_errors(&quoted)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{component}: {errors:?}");
    }
}

#[test]
fn every_text_parameter_refuses_u0000() {
    let doc = document();
    let mut checked = 0;
    for (method, path, op) in operations(&doc) {
        for parameter in op["parameters"].as_array().into_iter().flatten() {
            let schema = followed(&doc, &parameter["schema"]);
            if schema["type"] != "string" {
                continue;
            }
            let mut root = doc.clone();
            root["x-parameter"] = parameter["schema"].clone();
            root["$ref"] = Value::from("#/x-parameter");
            let name = &parameter["name"];
            let validator = jsonschema::draft202012::new(&root).unwrap();
            assert!(
                !validator.is_valid(&Value::from("1\u{0}")),
                "{method} {path} {name}"
            );
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} text parameters");
}

#[test]
fn a_pattern_that_lets_u0000_through_is_told_apart() {
    for pattern in [
        "^(/([^~/]|~[01])*)*$",
        "^[0-9]{1,18}\\.[0-9]{1,18}\\..+$",
        "^[\\u0000-\\u001F]+$",
        "^a\\u0000$",
        "^\\x00",
        "^\\D+$",
        "^[a-z",
    ] {
        assert!(admits_u0000(pattern), "{pattern}");
    }
    for pattern in [
        NO_U0000,
        "^[A-Za-z0-9._-]{1,64}$",
        "^[^\\u0000-\\u001F\\u007F-\\u009F]*$",
        "^[^/\\\\\\u0000-\\u001F]+$",
        "^3\\.1\\.[0-9]+$",
        "^NRD-[0-9]{4}$",
    ] {
        assert!(!admits_u0000(pattern), "{pattern}");
    }
    // And each pattern of the document that lets it through has the rule
    // beside it (but the one that says what holds U+0000).
    let mut doc = document();
    doc["components"]["schemas"]
        .as_object_mut()
        .unwrap()
        .remove(HOLDS_U0000)
        .unwrap();
    let mut found = 0;
    fn walk(v: &Value, found: &mut usize) {
        match v {
            Value::Object(map) => {
                if let Some(p) = map.get("pattern").and_then(Value::as_str)
                    && map.get("type").is_some()
                    && admits_u0000(p)
                {
                    let beside = map
                        .get("allOf")
                        .and_then(Value::as_array)
                        .is_some_and(|a| a.contains(&serde_json::json!({ "pattern": NO_U0000 })));
                    assert!(beside, "{p} without the rule beside it");
                    *found += 1;
                }
                map.values().for_each(|c| walk(c, found));
            }
            Value::Array(items) => items.iter().for_each(|c| walk(c, found)),
            _ => {}
        }
    }
    walk(&doc, &mut found);
    assert!(found >= 2, "{found}");
}
