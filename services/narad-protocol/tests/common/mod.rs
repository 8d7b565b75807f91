//! Shared by the integration tests: the repository's schema files,
//! compiled, each paired with the Rust parser of its type.

#![allow(dead_code)] // each test binary uses a part

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use jsonschema::{Retrieve, Uri, Validator};
use narad_protocol::commands::Command;
use narad_protocol::{Classified, ErrorBody, Reader};
use serde_json::Value;

pub fn schema_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema")
}

/// Serves the repository's schema files to the validator by `file://` URI.
pub struct SchemaFiles(HashMap<String, Value>);

impl Retrieve for SchemaFiles {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        self.0
            .get(uri.as_str())
            .cloned()
            .ok_or_else(|| format!("no schema file at {uri}").into())
    }
}

/// What a schema file describes, and so which Rust parser pairs with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Wire,
    Command,
    Document,
}

pub struct Schema {
    /// The path under `schema/`, e.g. `events/run.started.json`.
    pub path: String,
    /// The type or command name (the schema's `title`).
    pub name: String,
    pub family: Family,
    pub raw: Value,
    pub validator: Validator,
}

impl Schema {
    pub fn examples(&self) -> Vec<Value> {
        self.raw["examples"].as_array().cloned().unwrap_or_default()
    }

    pub fn schema_accepts(&self, v: &Value) -> bool {
        self.validator.is_valid(v)
    }

    /// The Rust parser's verdict: `Ok(json it re-serialises to)` or the error.
    pub fn rust_parse(&self, v: &Value) -> Result<Value, String> {
        match self.family {
            Family::Wire => match Reader::all_profiles().classify(v) {
                Ok(Classified::Accepted(obj)) => {
                    if obj.wire_type().name() == self.name {
                        Ok(obj.to_json())
                    } else {
                        Err(format!("parsed as {}", obj.wire_type().name()))
                    }
                }
                Ok(Classified::Ignored { type_name, reason }) => {
                    Err(format!("ignored {type_name}: {reason:?}"))
                }
                Err(e) => Err(e.to_string()),
            },
            Family::Command => match Command::parse(&self.name, v) {
                Some(Ok(c)) => Ok(serde_json::to_value(&c).unwrap()),
                Some(Err(e)) => Err(e.to_string()),
                None => Err(format!("no command named {}", self.name)),
            },
            Family::Document => match self.name.as_str() {
                "error" => serde_json::from_value::<ErrorBody>(v.clone())
                    .map(|b| serde_json::to_value(b).unwrap())
                    .map_err(|e| e.to_string()),
                other => panic!("no Rust parser for document {other}"),
            },
        }
    }
}

pub fn schemas() -> &'static [Schema] {
    static SCHEMAS: OnceLock<Vec<Schema>> = OnceLock::new();
    SCHEMAS.get_or_init(load_schemas)
}

fn load_schemas() -> Vec<Schema> {
    let root = schema_root().canonicalize().expect("schema/ exists");
    let mut files = Vec::new();
    collect_json(&root, &mut files);
    let mut by_uri = HashMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", f.display()));
        by_uri.insert(format!("file://{}", f.display()), value);
    }
    let mut out = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let family = match rel.split('/').next().unwrap() {
            "events" | "watch" | "hydrate" | "control" => Family::Wire,
            "commands" => Family::Command,
            "documents" => Family::Document,
            _ => continue, // shared definitions
        };
        let uri = format!("file://{}", f.display());
        let raw = by_uri[&uri].clone();
        let validator = jsonschema::options()
            .with_base_uri(uri.clone())
            .with_retriever(SchemaFiles(by_uri.clone()))
            .should_validate_formats(true)
            .build(&raw)
            .unwrap_or_else(|e| panic!("{rel} does not compile: {e}"));
        let name = raw["title"]
            .as_str()
            .expect("every schema has a title")
            .to_owned();
        out.push(Schema {
            path: rel,
            name,
            family,
            raw,
            validator,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

pub fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            collect_json(&p, out);
        } else if p.extension().is_some_and(|e| e == "json") {
            out.push(p);
        }
    }
}
