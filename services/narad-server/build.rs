//! Embeds every JSON Schema of `schema/` in the build: the OpenAPI
//! document's wire components are these files (`routes::openapi`), so a
//! schema added or changed there is in the next build's document.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(&root, &mut files);
    files.sort();
    let mut out = String::from("&[\n");
    for file in &files {
        let relative = file
            .strip_prefix(&root)
            .expect("under schema/")
            .to_str()
            .expect("schema paths are UTF-8")
            .replace('\\', "/");
        let absolute = file.canonicalize().expect("schema files exist");
        writeln!(
            out,
            "    ({relative:?}, include_str!({:?})),",
            absolute.display().to_string()
        )
        .expect("writes to a string");
    }
    out.push_str("]\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(dest.join("schema_files.rs"), out).expect("OUT_DIR is writable");
}

/// Every `*.json` under `dir`, with a `rerun-if-changed` for each folder.
fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("readable folder").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
}
