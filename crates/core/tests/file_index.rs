//! The file index of data diffusion against a plain model: a set of (worker, file) pairs that
//! every report, eviction and lost worker changes in the obvious way. After any sequence, the
//! index's two maps mirror each other and answer as the model does.

use kestrel_core::files::{CacheDelta, FileId, FileIndex, Hits};
use proptest::prelude::*;
use std::collections::BTreeSet;

#[derive(Clone, Debug)]
enum Op {
    Report {
        worker: u32,
        added: Vec<u32>,
        evicted: Vec<u32>,
    },
    NotHeld {
        worker: u32,
        file: u32,
    },
    Gone {
        worker: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let files = || proptest::collection::vec(0u32..12, 0..5);
    prop_oneof![
        4 => (0u32..5, files(), files())
            .prop_map(|(worker, added, evicted)| Op::Report { worker, added, evicted }),
        1 => (0u32..5, 0u32..12).prop_map(|(worker, file)| Op::NotHeld { worker, file }),
        1 => (0u32..5).prop_map(|worker| Op::Gone { worker }),
    ]
}

/// Every file's size is fixed by its number, as write-once files' are.
fn size(file: FileId) -> u64 {
    1_000 + u64::from(file)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_f11e), ..ProptestConfig::default() })]

    #[test]
    fn the_index_answers_as_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut ix = FileIndex::new();
        // Ten files are named; ids 10 and 11 never are, and reports of them must not count.
        let ids: Vec<FileId> = (0..10).map(|i| ix.intern(&format!("f{i}"))).collect();
        prop_assert_eq!(&ids, &(0..10).collect::<Vec<_>>());
        let mut model: BTreeSet<(u32, FileId)> = BTreeSet::new();
        for op in ops {
            match op {
                Op::Report { worker, added, evicted } => {
                    let delta = CacheDelta {
                        added: added.iter().map(|&f| (f, size(f))).collect(),
                        evicted: evicted.clone(),
                    };
                    ix.apply(worker, &delta);
                    for f in evicted {
                        model.remove(&(worker, f));
                    }
                    for f in added.into_iter().filter(|&f| f < 10) {
                        model.insert((worker, f));
                    }
                }
                Op::NotHeld { worker, file } => {
                    ix.not_held(worker, file);
                    model.remove(&(worker, file));
                }
                Op::Gone { worker } => {
                    ix.worker_gone(worker);
                    model.retain(|&(w, _)| w != worker);
                }
            }
            prop_assert_eq!(ix.audit(), Vec::<String>::new());
        }
        for w in 0..5 {
            for f in 0..12 {
                prop_assert_eq!(ix.holds(w, f), model.contains(&(w, f)), "worker {} file {}", w, f);
            }
            let wanted = [0, 3, 7, 11];
            let held: Vec<_> = wanted.iter().filter(|&&f| model.contains(&(w, f))).collect();
            let expected = Hits {
                files: held.len() as u32,
                bytes: held.iter().map(|&&f| size(f)).sum(),
            };
            prop_assert_eq!(ix.hits(w, &wanted), expected);
        }
        let mut out = Vec::new();
        ix.candidates(&[0, 3, 7], &mut out);
        for pair in out.windows(2) {
            prop_assert!(pair[0].1 >= pair[1].1, "most data first: {:?}", out);
        }
        let listed: BTreeSet<u32> = out.iter().map(|(w, _)| *w).collect();
        let holding: BTreeSet<u32> = model.iter().filter(|(_, f)| [0, 3, 7].contains(f)).map(|(w, _)| *w).collect();
        prop_assert_eq!(listed, holding);
    }
}
