//! `--format parquet` (cargo feature `parquet`): Hugging Face parquet shards with a `text`
//! column, e.g. the `wikitext-103-raw-v1/` folder of the `wikitext` dataset repository
//! (`train-00000-of-00002.parquet`, `train-00001-of-00002.parquet`,
//! `validation-00000-of-00001.parquet`, `test-00000-of-00001.parquet`).

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;

use super::prepare::{Built, RowJoin, build_from_rows};

/// The shards of split `prefix` in `dir`: `prefix-*.parquet` or `prefix.parquet`, by name.
fn shards(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".parquet")
            && (name == format!("{prefix}.parquet") || name.starts_with(&format!("{prefix}-")))
        {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The `text` column of one parquet file, one string per row (null rows are empty strings).
fn read_text_column(path: &Path) -> Result<Vec<String>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let reader = SerializedFileReader::new(file)
        .with_context(|| format!("{} is not a readable parquet file", path.display()))?;
    let schema = reader.metadata().file_metadata().schema_descr();
    let fields = schema.root_schema().get_fields();
    let Some(field) = fields.iter().find(|f| f.name() == "text") else {
        let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
        bail!(
            "{}: no `text` column (columns: {})",
            path.display(),
            names.join(", ")
        );
    };
    let projection = Type::group_type_builder("schema")
        .with_fields(vec![field.clone()])
        .build()
        .with_context(|| format!("{}: cannot project the `text` column", path.display()))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::with_capacity(reader.metadata().file_metadata().num_rows().max(0) as usize);
    for (i, row) in rows.enumerate() {
        let row = row.with_context(|| format!("cannot read row {i} of {}", path.display()))?;
        let text = match row.get_column_iter().next().map(|(_, f)| f) {
            Some(Field::Str(s)) => s.clone(),
            Some(Field::Null) | None => String::new(),
            Some(Field::Bytes(b)) => String::from_utf8(b.data().to_vec()).map_err(|e| {
                anyhow::anyhow!("{}: row {i} of `text` is not UTF-8: {e}", path.display())
            })?,
            Some(other) => bail!(
                "{}: column `text` holds {other:?} in row {i}, not strings",
                path.display()
            ),
        };
        out.push(text);
    }
    Ok(out)
}

/// Reads the train/validation/test shards of `dir` and tokenises them.
pub(crate) fn build(dir: &Path, join: RowJoin) -> Result<Built> {
    anyhow::ensure!(
        dir.is_dir(),
        "--format parquet: {} is not a directory",
        dir.display()
    );
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (name, prefixes, required) in [
        ("train", &["train"][..], true),
        ("valid", &["validation", "valid"][..], true),
        ("test", &["test"][..], false),
    ] {
        let mut files = Vec::new();
        for p in prefixes {
            files = shards(dir, p)?;
            if !files.is_empty() {
                break;
            }
        }
        if !files.is_empty() {
            found.push((name, files));
        } else if required {
            missing.push(format!("{}-*.parquet", prefixes[0]));
        }
    }
    if !missing.is_empty() {
        bail!(
            "{}: missing {}: expected train-*.parquet and validation-*.parquet (test-*.parquet optional) with a `text` column, \
             as in a config folder of the Hugging Face `wikitext` repository (e.g. wikitext-103-raw-v1/)",
            dir.display(),
            missing.join(" and ")
        );
    }
    let mut per_split = Vec::new();
    for (name, files) in found {
        let mut rows = Vec::new();
        for f in &files {
            rows.extend(read_text_column(f)?);
        }
        let shown: Vec<String> = files
            .iter()
            .map(|f| {
                f.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        per_split.push((name, shown.join(", "), rows));
    }
    build_from_rows(dir, per_split, join)
}
