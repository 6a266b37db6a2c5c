//! Data generators of the synthetic tasks: determinism, structural invariants over many seeds and
//! sizes, the power law of zoology's query gaps, preconditions, regions, batching, masked accuracy
//! and the TOML form of the configs. Runs in well under a second.

use std::collections::HashSet;

use loglinear_cli::tasks::selective_copy::{BLANK, DATA_TOKENS, NOISE_TOKENS, SEPARATOR};
use loglinear_cli::tasks::{
    Example, IGNORE, MqarConfig, MqarLayout, SelectiveCopyConfig, TaskConfig, batch,
    masked_accuracy,
};

fn zoology(v: usize, t: usize, k: usize) -> MqarConfig {
    MqarConfig::new(v, t, k)
}

fn seed_layout(v: usize, t: usize, k: usize) -> MqarConfig {
    MqarConfig {
        layout: MqarLayout::Seed,
        ..MqarConfig::new(v, t, k)
    }
}

fn selcopy(t: usize, m: usize) -> SelectiveCopyConfig {
    SelectiveCopyConfig {
        num_tokens: m,
        ..SelectiveCopyConfig::new(t)
    }
}

fn scored(ex: &Example) -> Vec<usize> {
    (0..ex.targets.len())
        .filter(|&p| ex.targets[p] != IGNORE)
        .collect()
}

fn all_configs() -> Vec<TaskConfig> {
    vec![
        TaskConfig::Mqar(zoology(64, 32, 4)),
        TaskConfig::Mqar(zoology(8192, 256, 16)),
        TaskConfig::Mqar(MqarConfig {
            random_non_queries: false,
            ..zoology(64, 32, 8)
        }),
        TaskConfig::Mqar(seed_layout(128, 128, 8)),
        TaskConfig::Mqar(seed_layout(128, 128, 32)),
        TaskConfig::Mqar(seed_layout(128, 101, 4)),
        TaskConfig::SelectiveCopy(selcopy(256, 16)),
        TaskConfig::SelectiveCopy(selcopy(9, 4)),
    ]
}

#[test]
fn same_seed_same_data_other_seed_other_data() {
    for cfg in all_configs() {
        let a = cfg.generate(40, 7).unwrap();
        assert_eq!(a, cfg.generate(40, 7).unwrap(), "{}", cfg.name());
        assert_ne!(a, cfg.generate(40, 8).unwrap(), "{}", cfg.name());
        // A smaller pool from the same seed is a prefix of the larger one.
        assert_eq!(a[..10], cfg.generate(10, 7).unwrap()[..], "{}", cfg.name());
        // Not every example of a pool is the same.
        assert!(a.iter().any(|e| *e != a[0]), "{}", cfg.name());
        assert_eq!(cfg.generate(0, 7).unwrap(), vec![]);
    }
}

/// Invariants shared by both MQAR layouts; returns the scored positions.
fn check_mqar_common(cfg: &MqarConfig, ex: &Example) -> Vec<usize> {
    let (v, t, k) = (cfg.vocab_size, cfg.seq_len, cfg.num_kv_pairs);
    let name = cfg.name();
    assert_eq!((ex.inputs.len(), ex.targets.len()), (t, t), "{name}");
    assert!(
        ex.inputs.iter().all(|&x| (x as usize) < v),
        "{name}: token out of range"
    );
    let keys: Vec<u32> = (0..k).map(|j| ex.inputs[2 * j]).collect();
    let values: Vec<u32> = (0..k).map(|j| ex.inputs[2 * j + 1]).collect();
    assert!(
        keys.iter().all(|&x| x >= 1 && (x as usize) < v / 2),
        "{name}: keys {keys:?}"
    );
    assert!(
        values.iter().all(|&x| (x as usize) >= v / 2),
        "{name}: values {values:?}"
    );
    assert_eq!(
        keys.iter().collect::<HashSet<_>>().len(),
        k,
        "{name}: keys not distinct"
    );
    assert_eq!(
        values.iter().collect::<HashSet<_>>().len(),
        k,
        "{name}: values not distinct"
    );

    let pos = scored(ex);
    assert_eq!(pos.len(), k, "{name}: scored positions {pos:?}");
    assert_eq!(ex.num_scored(), k);
    let mut asked = HashSet::new();
    for &p in &pos {
        assert!(p >= 2 * k, "{name}: label inside the context at {p}");
        let j = keys
            .iter()
            .position(|&x| x == ex.inputs[p])
            .expect("a query is a key");
        assert_eq!(
            ex.targets[p],
            i64::from(values[j]),
            "{name}: wrong value at {p}"
        );
        assert!(asked.insert(j), "{name}: key {} asked twice", keys[j]);
    }
    pos
}

#[test]
fn zoology_structure() {
    let sizes = [
        (20, 16, 2),
        (64, 32, 8),
        (65, 64, 1),
        (300, 256, 16),
        (8192, 256, 64),
        (130, 128, 32),
    ];
    for (v, t, k) in sizes {
        for random in [true, false] {
            let cfg = MqarConfig {
                random_non_queries: random,
                ..zoology(v, t, k)
            };
            for ex in cfg.generate(30, (v * t + k) as u64).unwrap() {
                let pos = check_mqar_common(&cfg, &ex);
                let gaps: HashSet<usize> = pos.iter().map(|&p| (p - 2 * k) / 2).collect();
                assert!(
                    pos.iter().all(|&p| (p - 2 * k) % 2 == 0),
                    "queries at even offsets: {pos:?}"
                );
                assert_eq!(gaps.len(), k);
                if !random {
                    let zeros = (2 * k..t).filter(|&p| ex.inputs[p] == 0).count();
                    assert_eq!(
                        zeros,
                        t - 3 * k,
                        "every non-query slot of the query region stays 0"
                    );
                }
            }
        }
    }
}

#[test]
fn zoology_random_filler_covers_the_vocabulary() {
    // Filler is uniform over 0..V: with V = 20 every token, 0 included, shows up.
    let cfg = zoology(20, 16, 2);
    let mut seen = HashSet::new();
    for ex in cfg.generate(200, 1).unwrap() {
        let pos = scored(&ex);
        seen.extend((4..16).filter(|p| !pos.contains(p)).map(|p| ex.inputs[p]));
    }
    assert_eq!(seen.len(), 20, "{seen:?}");
}

#[test]
fn zoology_gaps_follow_the_power_law() {
    // K = 1: the single gap is drawn with p(gap = i−1) ∝ a·i^(a−1) exactly.
    let cfg = zoology(100, 64, 1);
    let space = 31;
    let w: Vec<f64> = (1..=space).map(|i| (i as f64).powf(0.01 - 1.0)).collect();
    let total: f64 = w.iter().sum();
    let n = 4000;
    let mut hist = vec![0usize; space];
    for ex in cfg.generate(n, 11).unwrap() {
        hist[(scored(&ex)[0] - 2) / 2] += 1;
    }
    for gap in [0, 1, 5, 30] {
        let p = w[gap] / total;
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        let got = hist[gap] as f64 / n as f64;
        assert!(
            (got - p).abs() < 5.0 * sigma,
            "gap {gap}: frequency {got}, expected {p}"
        );
    }

    // K = 8, T = 512: more small gaps than large ones (distinct gaps flatten the law a little).
    let cfg = zoology(1000, 512, 8);
    let space = (512 - 16) / 2;
    let mut hist = vec![0usize; space];
    for ex in cfg.generate(500, 12).unwrap() {
        let pos = scored(&ex);
        let gaps: HashSet<usize> = pos.iter().map(|&p| (p - 16) / 2).collect();
        assert_eq!(gaps.len(), 8, "gaps are distinct");
        for g in gaps {
            hist[g] += 1;
        }
    }
    let first_half: usize = hist[..space / 2].iter().sum();
    let second_half: usize = hist[space / 2..].iter().sum();
    assert!(
        first_half > 3 * second_half,
        "halves {first_half} vs {second_half}"
    );
    let head: usize = hist[..10].iter().sum();
    let tail: usize = hist[space - 10..].iter().sum();
    assert!(head > 5 * tail, "first 10 gaps {head} vs last 10 {tail}");
    assert!(
        hist[0] == *hist.iter().max().unwrap(),
        "gap 0 is the most frequent"
    );
}

#[test]
fn seed_layout_structure() {
    let sizes = [
        (16, 12, 2),
        (128, 128, 8),
        (128, 256, 16),
        (128, 101, 4),
        (128, 128, 32),
        (1024, 64, 16),
    ];
    for (v, t, k) in sizes {
        for random in [true, false] {
            let cfg = MqarConfig {
                random_non_queries: random,
                ..seed_layout(v, t, k)
            };
            for ex in cfg.generate(30, (v + t + k) as u64).unwrap() {
                let pos = check_mqar_common(&cfg, &ex);
                let expected: Vec<usize> = (0..k).map(|i| t - 2 * k + 2 * i).collect();
                assert_eq!(pos, expected, "{}: queries at the end", cfg.name());
                for p in (2 * k..t).filter(|p| !pos.contains(p)) {
                    let x = ex.inputs[p];
                    assert!(
                        if random { x >= 1 } else { x == 0 },
                        "{}: filler {x} at {p}",
                        cfg.name()
                    );
                }
            }
        }
    }
}

#[test]
fn seed_layout_k32_t128_has_no_filler() {
    let cfg = seed_layout(128, 128, 32);
    let names: Vec<String> = cfg.regions().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["key-value pairs", "queries"]);
    for ex in cfg.generate(20, 0).unwrap() {
        check_mqar_common(&cfg, &ex);
        // 0..63: pairs; 64..127: queries (even) and answer slots (odd).
        assert_eq!(scored(&ex), (64..128).step_by(2).collect::<Vec<_>>());
        let context: HashSet<u32> = ex.inputs[..64].iter().step_by(2).copied().collect();
        let queried: HashSet<u32> = ex.inputs[64..].iter().step_by(2).copied().collect();
        assert_eq!(context, queried);
    }
}

#[test]
fn selective_copy_structure() {
    for (t, m) in [
        (9, 4),
        (13, 4),
        (40, 1),
        (64, 16),
        (256, 16),
        (512, 16),
        (127, 63),
    ] {
        let cfg = selcopy(t, m);
        let n = t - m - 1;
        assert_eq!(cfg.input_len(), n);
        for ex in cfg.generate(30, t as u64).unwrap() {
            assert_eq!((ex.inputs.len(), ex.targets.len()), (t, t));
            assert_eq!(ex.inputs[n], SEPARATOR);
            assert!(ex.inputs[n + 1..].iter().all(|&x| x == BLANK));
            assert_eq!(ex.inputs[n + 1..].len(), m);
            let data: Vec<u32> = ex.inputs[..n]
                .iter()
                .copied()
                .filter(|x| DATA_TOKENS.contains(x))
                .collect();
            assert_eq!(data.len(), m, "{}: data tokens {data:?}", cfg.name());
            assert_eq!(
                data.iter().collect::<HashSet<_>>().len(),
                m,
                "data tokens distinct"
            );
            assert!(
                ex.inputs[..n]
                    .iter()
                    .all(|x| DATA_TOKENS.contains(x) || NOISE_TOKENS.contains(x))
            );
            // Position p predicts the label of p + 1: the separator and the first M − 1 blanks.
            assert_eq!(scored(&ex), (n..n + m).collect::<Vec<_>>());
            let want: Vec<i64> = data.iter().map(|&x| i64::from(x)).collect();
            assert_eq!(ex.targets[n..n + m], want[..]);
            assert_eq!(ex.targets[t - 1], IGNORE);
        }
    }
}

#[test]
fn preconditions_name_the_field() {
    let cases: Vec<(TaskConfig, &str)> = vec![
        (TaskConfig::Mqar(zoology(64, 31, 4)), "seq_len"),
        (TaskConfig::Mqar(zoology(32, 32, 4)), "vocab_size"),
        (TaskConfig::Mqar(zoology(64, 32, 9)), "num_kv_pairs"),
        (TaskConfig::Mqar(zoology(64, 32, 0)), "num_kv_pairs"),
        (
            TaskConfig::Mqar(MqarConfig {
                power_a: 0.0,
                ..zoology(64, 32, 4)
            }),
            "power_a",
        ),
        (
            TaskConfig::Mqar(MqarConfig {
                power_a: f64::NAN,
                ..zoology(64, 32, 4)
            }),
            "power_a",
        ),
        (TaskConfig::Mqar(seed_layout(128, 127, 32)), "num_kv_pairs"),
        (TaskConfig::Mqar(seed_layout(16, 64, 8)), "num_kv_pairs"),
        (
            TaskConfig::Mqar(MqarConfig {
                power_a: 0.5,
                ..seed_layout(128, 128, 8)
            }),
            "power_a",
        ),
        (
            TaskConfig::SelectiveCopy(SelectiveCopyConfig {
                vocab_size: 256,
                ..selcopy(64, 16)
            }),
            "vocab_size",
        ),
        (TaskConfig::SelectiveCopy(selcopy(64, 0)), "num_tokens"),
        (TaskConfig::SelectiveCopy(selcopy(200, 64)), "num_tokens"),
        (TaskConfig::SelectiveCopy(selcopy(32, 16)), "seq_len"),
    ];
    for (cfg, field) in cases {
        let err = cfg.validate().expect_err(&cfg.name());
        assert_eq!(err.field(), field, "{}: {err}", cfg.name());
        assert!(err.to_string().contains(field), "{err}");
        assert_eq!(cfg.generate(1, 0).unwrap_err(), err);
    }
    // The boundaries themselves are valid.
    for cfg in [
        TaskConfig::Mqar(zoology(33, 32, 8)),
        TaskConfig::Mqar(seed_layout(128, 128, 32)),
        TaskConfig::Mqar(seed_layout(10, 17, 4)),
        TaskConfig::SelectiveCopy(selcopy(33, 16)),
        TaskConfig::SelectiveCopy(selcopy(127, 63)),
    ] {
        cfg.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", cfg.name()));
    }
}

#[test]
fn masked_accuracy_counts_only_scored_positions() {
    assert_eq!(masked_accuracy(&[], &[]), (0, 0));
    assert_eq!(masked_accuracy(&[1, 2, 3], &[IGNORE; 3]), (0, 0));
    assert_eq!(
        masked_accuracy(&[4, 9, 6, 0], &[IGNORE, 9, 7, IGNORE]),
        (1, 2)
    );
    // Predicting the targets everywhere (anything at ignored positions) is perfect.
    let cfg = TaskConfig::Mqar(zoology(64, 32, 4));
    let b = batch(&cfg.generate(8, 3).unwrap(), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let perfect: Vec<u32> = b
        .targets
        .iter()
        .map(|&t| if t == IGNORE { 63 } else { t as u32 })
        .collect();
    assert_eq!(masked_accuracy(&perfect, &b.targets), (32, 32));
    let shifted: Vec<u32> = perfect.iter().map(|&p| p ^ 1).collect();
    assert_eq!(masked_accuracy(&shifted, &b.targets), (0, 32));
}

#[test]
fn regions_tile_the_sequence() {
    for cfg in all_configs() {
        let regions = cfg.regions();
        assert_eq!(regions[0].range.start, 0, "{}", cfg.name());
        assert_eq!(
            regions.last().unwrap().range.end,
            cfg.seq_len(),
            "{}",
            cfg.name()
        );
        for w in regions.windows(2) {
            assert_eq!(w[0].range.end, w[1].range.start, "{}", cfg.name());
        }
        assert!(
            regions.iter().all(|r| !r.range.is_empty()),
            "{}: {regions:?}",
            cfg.name()
        );
    }
    let named = |cfg: TaskConfig| -> Vec<(String, std::ops::Range<usize>)> {
        cfg.regions()
            .into_iter()
            .map(|r| (r.name, r.range))
            .collect()
    };
    let s = |x: &str| x.to_string();
    assert_eq!(
        named(TaskConfig::Mqar(zoology(8192, 256, 16))),
        [(s("context"), 0..32), (s("query region"), 32..256)]
    );
    assert_eq!(
        named(TaskConfig::Mqar(seed_layout(128, 256, 16))),
        [
            (s("key-value pairs"), 0..32),
            (s("filler"), 32..224),
            (s("queries"), 224..256)
        ]
    );
    assert_eq!(
        named(TaskConfig::SelectiveCopy(selcopy(256, 16))),
        [
            (s("input"), 0..239),
            (s("separator"), 239..240),
            (s("output"), 240..256)
        ]
    );
}

#[test]
fn with_seq_len_changes_only_the_length() {
    let train = TaskConfig::Mqar(seed_layout(128, 128, 8));
    let test = train.with_seq_len(256);
    assert_eq!(test, TaskConfig::Mqar(seed_layout(128, 256, 8)));
    assert_eq!(
        (train.seq_len(), test.seq_len(), test.vocab_size()),
        (128, 256, 128)
    );
    assert!(
        test.generate(5, 1)
            .unwrap()
            .iter()
            .all(|e| e.inputs.len() == 256 && e.num_scored() == 8)
    );

    let sc = TaskConfig::SelectiveCopy(selcopy(256, 16)).with_seq_len(1024);
    assert_eq!(sc, TaskConfig::SelectiveCopy(selcopy(1024, 16)));
    assert!(
        sc.generate(3, 1)
            .unwrap()
            .iter()
            .all(|e| e.inputs.len() == 1024 && e.num_scored() == 16)
    );

    // zoology needs V > T, so a longer test length can break a precondition; validate says which.
    let z = TaskConfig::Mqar(zoology(300, 256, 16)).with_seq_len(512);
    assert_eq!(z.validate().unwrap_err().field(), "vocab_size");
}

#[test]
fn batch_gathers_rows() {
    let cfg = TaskConfig::SelectiveCopy(selcopy(20, 4));
    let pool = cfg.generate(6, 5).unwrap();
    let b = batch(&pool, &[4, 1, 4]);
    assert_eq!((b.batch, b.seq_len), (3, 20));
    assert_eq!((b.inputs.len(), b.targets.len()), (60, 60));
    for (row, &i) in [4, 1, 4].iter().enumerate() {
        assert_eq!(b.inputs[row * 20..(row + 1) * 20], pool[i].inputs[..]);
        assert_eq!(b.targets[row * 20..(row + 1) * 20], pool[i].targets[..]);
    }
    let empty = batch(&pool, &[]);
    assert_eq!((empty.batch, empty.inputs.len()), (0, 0));
}

#[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
struct Experiment {
    task: TaskConfig,
}

#[test]
fn toml_configs() {
    let parse = |s: &str| toml::from_str::<Experiment>(s).map(|e| e.task);
    let mqar =
        parse("task = { mqar = { vocab_size = 256, seq_len = 64, num_kv_pairs = 4 } }").unwrap();
    assert_eq!(mqar, TaskConfig::Mqar(zoology(256, 64, 4)));
    let seed = parse(
        "[task.mqar]\nvocab_size = 128\nseq_len = 128\nnum_kv_pairs = 32\nlayout = \"seed\"\n\
         random_non_queries = false\n",
    )
    .unwrap();
    assert_eq!(
        seed,
        TaskConfig::Mqar(MqarConfig {
            random_non_queries: false,
            ..seed_layout(128, 128, 32)
        })
    );
    let sc = parse("task = { selective_copy = { seq_len = 256 } }").unwrap();
    assert_eq!(
        sc,
        TaskConfig::SelectiveCopy(SelectiveCopyConfig {
            seq_len: 256,
            num_tokens: 16,
            vocab_size: 128
        })
    );

    for bad in [
        "task = { mqar = { vocab_size = 256, seq_len = 64, num_kv_pairs = 4, kv_pairs = 3 } }",
        "task = { mqar = { vocab_size = 256, seq_len = 64 } }",
        "task = { mqar = { vocab_size = 256, seq_len = 64, num_kv_pairs = 4, layout = \"end\" } }",
        "task = { copy = { seq_len = 256 } }",
    ] {
        assert!(parse(bad).is_err(), "accepted: {bad}");
    }
    // What is written reads back unchanged.
    for task in all_configs() {
        let text = toml::to_string(&Experiment { task: task.clone() }).unwrap();
        assert_eq!(parse(&text).unwrap(), task, "{text}");
    }
}

#[test]
fn names() {
    assert_eq!(
        TaskConfig::Mqar(zoology(8192, 256, 16)).name(),
        "mqar(zoology, V=8192, T=256, K=16)"
    );
    assert_eq!(
        TaskConfig::Mqar(seed_layout(128, 128, 32)).name(),
        "mqar(seed, V=128, T=128, K=32)"
    );
    let odd = MqarConfig {
        power_a: 0.1,
        random_non_queries: false,
        ..zoology(64, 32, 4)
    };
    assert_eq!(
        odd.name(),
        "mqar(zoology, V=64, T=32, K=4, a=0.1, zero filler)"
    );
    assert_eq!(
        TaskConfig::SelectiveCopy(selcopy(256, 16)).name(),
        "selective_copy(V=128, T=256, M=16)"
    );
}

#[test]
fn display_shows_positions_inputs_and_targets() {
    let ex = Example {
        inputs: vec![3, 10, 3],
        targets: vec![IGNORE, IGNORE, 10],
    };
    let text = ex.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "pos       0  1  2",
            "inputs    3 10  3",
            "targets   ·  · 10"
        ]
    );
}
