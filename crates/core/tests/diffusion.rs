//! Data diffusion through the virtual-time harness: jobs whose tasks read files, workers with
//! caches, a store that saturates, and Falkon's dispatch policies side by side.

mod common;

use common::Events;
use kestrel_core::harness::{DataStats, Harness, SimData};
use kestrel_core::*;

/// Lines naming one of `files` files for each of `tasks` tasks, picked by a fixed generator:
/// uniformly, or skewed (half the tasks read a tenth of the files).
fn picks(tasks: u32, files: u32, skewed: bool) -> LineList {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..tasks)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = if skewed && x.is_multiple_of(2) {
                (x >> 8) % u64::from(files / 10)
            } else {
                (x >> 8) % u64::from(files)
            };
            format!("f{n}")
        })
        .collect::<Vec<_>>()
        .iter()
        .map(String::as_str)
        .collect()
}

/// A job of `lines` whose tasks read `data/{line}`, placed by `policy`.
fn reader(policy: PolicyName) -> JobSpec {
    let mut spec = JobSpec::command("reader", vec!["/bin/true".into(), "{line}".into()]);
    spec.template.files.inputs = vec!["data/{line}".into()];
    spec.placement.policy = Some(policy);
    spec
}

struct Outcome {
    makespan_us: u64,
    stats: DataStats,
    /// Share of slot time spent computing.
    util: f64,
}

const COMPUTE_US: u64 = 10_000;

/// Runs `tasks` reads of `files` files on 4 workers of 2 slots whose caches hold `cache_files`
/// files each, with a store that serves one file per 10 ms.
fn run(policy: PolicyName, tasks: u32, files: u32, cache_files: usize, skewed: bool) -> Outcome {
    run_warm(policy, tasks, files, cache_files, skewed, false)
}

/// [`run`], after one task (with `warm`) has read the first file on one worker.
fn run_warm(
    policy: PolicyName,
    tasks: u32,
    files: u32,
    cache_files: usize,
    skewed: bool,
    warm: bool,
) -> Outcome {
    let sched = Scheduler::new(Config::default());
    let mut h = Harness::new(sched, 200, COMPUTE_US).with_data(SimData {
        cache_files,
        file_bytes: 1_000_000,
        local_us: 100,
        peer_us: 2_000,
        store_us: 10_000,
    });
    for _ in 0..4 {
        h.add_worker(2, 2);
    }
    if warm {
        let one = h.submit(reader(policy), TaskSet::Lines(["f0"].into_iter().collect()));
        h.run_until_idle();
        assert_eq!(h.sched.job(one).map(|j| j.counts.finished), Some(1));
        h.data_stats = DataStats::default();
    }
    let start = h.now_us;
    let job = h.submit(reader(policy), TaskSet::Lines(picks(tasks, files, skewed)));
    h.run_until_idle();
    let j = h.sched.job(job).expect("the job");
    assert_eq!(j.counts.finished, tasks, "{policy}: every task ran");
    assert!(h.sched.audit().is_empty(), "{:?}", h.sched.audit());
    let makespan_us = j.finished_us.expect("done") - start;
    Outcome {
        makespan_us,
        stats: h.data_stats,
        util: (u64::from(tasks) * COMPUTE_US) as f64 / (makespan_us * 8) as f64,
    }
}

/// One run's figures, as a line for a failing assertion.
fn show(name: PolicyName, o: &Outcome) -> String {
    format!(
        "{name}: {:.2} s, util {:.2}, local {} peer {} store {}",
        o.makespan_us as f64 / 1e6,
        o.util,
        o.stats.local,
        o.stats.peer,
        o.stats.store
    )
}

#[test]
fn data_aware_placement_beats_first_available_on_a_saturated_store() {
    // 2,000 tasks over 200 files, caches of 50 files on each of 4 workers: the aggregate cache
    // holds the working set. The store serves 100 files/s, the slots could run 800 tasks/s.
    let fa = run(PolicyName::FirstAvailable, 2_000, 200, 50, false);
    let gcc = run(PolicyName::GoodCacheCompute, 2_000, 200, 50, false);
    let why = format!(
        "{} / {}",
        show(PolicyName::FirstAvailable, &fa),
        show(PolicyName::GoodCacheCompute, &gcc)
    );
    assert!(gcc.makespan_us * 4 <= fa.makespan_us, "{why}");
    assert!(gcc.stats.store * 5 <= fa.stats.store, "{why}");
    // Each file is read from the store once, then only from caches.
    assert_eq!(gcc.stats.store, 200, "{why}");
    // Telling workers where peers hold their inputs alone already saves store reads.
    let fca = run(PolicyName::FirstCacheAvailable, 2_000, 200, 50, false);
    assert!(
        fca.stats.store < fa.stats.store && fca.stats.peer > 0,
        "{}",
        show(PolicyName::FirstCacheAvailable, &fca)
    );
}

#[test]
fn one_hot_input_shows_the_dissertations_order_of_the_policies() {
    // Every task reads the same file, which one worker already holds (Ray #54372: ten tasks
    // ran one at a time on the node holding their argument). Max-cache-hit waits for the one holder: the best hit ratio and
    // a quarter of the cluster busy. Max-compute-util spreads the tasks, fetching from peers.
    // Good-cache-compute does the latter while the cluster is not busy: the best time.
    let outcome = |p| run_warm(p, 400, 1, 10, false, true);
    let (mch, mcu, gcc) = (
        outcome(PolicyName::MaxCacheHit),
        outcome(PolicyName::MaxComputeUtil),
        outcome(PolicyName::GoodCacheCompute),
    );
    let why = [
        (PolicyName::MaxCacheHit, &mch),
        (PolicyName::MaxComputeUtil, &mcu),
        (PolicyName::GoodCacheCompute, &gcc),
    ]
    .map(|(p, o)| show(p, o))
    .join(" / ");
    let local = |o: &Outcome| o.stats.local as f64 / 400.0;
    assert!(
        local(&mch) > local(&mcu),
        "MCH has the best hit ratio: {why}"
    );
    assert!(
        mch.util < 0.3 && mcu.util > 2.0 * mch.util,
        "MCU the best utilisation: {why}"
    );
    assert!(
        gcc.makespan_us <= mch.makespan_us.min(mcu.makespan_us),
        "GCC the best time: {why}"
    );
    assert!(mcu.stats.peer >= 3 && mch.stats.peer == 0, "{why}");
}

/// A worker of 2 slots that `stages_files` or not, without Python.
fn offer(stages_files: bool) -> WorkerOffer {
    common::offer(stages_files, false)
}

fn join(s: &mut Scheduler, o: WorkerOffer) -> WorkerId {
    match s.handle(0, Event::WorkerJoined { offer: o }) {
        Ok(Reply::Joined(id)) => id,
        other => panic!("{other:?}"),
    }
}

#[test]
fn tasks_with_files_go_only_to_workers_with_a_cache() {
    let mut s = Scheduler::default();
    let old = join(&mut s, offer(false));
    let new = join(&mut s, offer(true));
    let mut with_files = JobSpec::command("reads", vec!["cat".into()]);
    with_files.template.files.inputs = vec!["in/{task}".into()];
    let reads = s
        .submit(0, with_files, common::array(2), false)
        .expect("submits");
    let plain = s
        .submit(0, common::spec("plain"), common::array(2), false)
        .expect("submits");
    let got = common::assignments(&mut s, 1);
    assert_eq!(got, vec![(old, plain, 2), (new, reads, 2)]);
    // Without a worker that has a cache, the job says why it does not move.
    s.handle(2, Event::WorkerLost { worker: new }).unwrap();
    assert_eq!(s.stall(reads), Some(Stall::NoCache));
    assert_eq!(s.stall(plain), None);
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}

#[test]
fn inputs_are_numbered_as_workers_name_them() {
    let mut s = Scheduler::default();
    let mut spec = JobSpec::command("sim", vec!["sim".into()]);
    spec.template.files.inputs = vec!["raw/{task}.fits".into(), "db/ref".into()];
    let job = s
        .submit(
            0,
            spec.clone(),
            TaskSet::Array(IdRanges::parse("5-7").unwrap()),
            false,
        )
        .unwrap();
    // Names are qualified by the job's store (none here), as workers name their files.
    let id = |s: &Scheduler, n: &str| {
        let name = kestrel_core::files::cached_name(None, n);
        s.files()
            .id(&name)
            .unwrap_or_else(|| panic!("{name} numbered"))
    };
    let j = s.job(job).unwrap();
    assert_eq!(j.inputs_of(1), &[id(&s, "raw/6.fits"), id(&s, "db/ref")]);
    assert_eq!(
        s.files().len(),
        4,
        "three tasks' own inputs and one they share"
    );
    // An open list takes more tasks: theirs are numbered as they come.
    spec.template.argv.clear();
    let list = s
        .submit(0, spec, TaskSet::List(vec![vec!["a".into()]]), true)
        .unwrap();
    s.extend(0, list, 1, vec![vec!["b".into()], vec!["c".into()]], true)
        .unwrap();
    let l = s.job(list).unwrap();
    assert_eq!(l.inputs_of(2), &[id(&s, "raw/2.fits"), id(&s, "db/ref")]);
    assert!(l.inputs_of(3).is_empty());
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}

#[test]
fn files_of_two_stores_are_two_files() {
    // One name in two stores: two files for the index, so a worker caching one store's copy
    // is no hit for the other's tasks.
    let mut s = Scheduler::new(Config {
        store: Some("/data/a".into()),
        ..Config::default()
    });
    let mut in_a = JobSpec::command("a", vec!["cat".into()]);
    in_a.template.files.inputs = vec!["raw/1".into()];
    let mut in_b = in_a.clone();
    in_b.placement.store = Some("/data/b".into());
    let a = s.submit(0, in_a, common::array(1), false).unwrap();
    let b = s.submit(0, in_b, common::array(1), false).unwrap();
    let (ia, ib) = (
        s.job(a).unwrap().inputs_of(0),
        s.job(b).unwrap().inputs_of(0),
    );
    assert_ne!(ia, ib);
    let name = |f: &[kestrel_core::files::FileId]| s.files().name(f[0]).unwrap().to_string();
    assert_eq!(
        name(ia),
        kestrel_core::files::cached_name(Some("/data/a"), "raw/1")
    );
}

#[test]
fn a_file_name_that_leaves_the_store_is_refused() {
    let mut s = Scheduler::default();
    for bad in ["../etc/passwd", "/abs", "a//b", "", "x/./y"] {
        let mut spec = JobSpec::command("bad", vec!["x".into()]);
        spec.template.files.inputs = vec![bad.into()];
        let err = s.submit(0, spec, common::array(1), false).unwrap_err();
        assert!(
            matches!(err, SchedError::Spec(SpecError::FileName { .. })),
            "{bad:?}: {err}"
        );
    }
    assert_eq!(s.jobs().count(), 0, "nothing half-submitted");
}

#[test]
fn a_lost_worker_leaves_the_index_and_its_tasks_are_placed_again() {
    let sched = Scheduler::new(Config::default());
    let mut h = Harness::new(sched, 200, COMPUTE_US).with_data(SimData {
        cache_files: 20,
        file_bytes: 1_000,
        local_us: 100,
        peer_us: 2_000,
        store_us: 10_000,
    });
    let workers: Vec<WorkerId> = (0..3).map(|_| h.add_worker(2, 2)).collect();
    let job = h.submit(
        reader(PolicyName::GoodCacheCompute),
        TaskSet::Lines(picks(600, 40, true)),
    );
    h.run_until(h.now_us + 500_000);
    assert!(
        h.sched.files().held_count(workers[0]) > 0,
        "it cached inputs"
    );
    h.kill_worker(workers[0]);
    assert_eq!(h.sched.files().held_count(workers[0]), 0);
    assert!(h.sched.audit().is_empty(), "{:?}", h.sched.audit());
    h.run_until_idle();
    assert_eq!(h.sched.job(job).unwrap().counts.finished, 600);
    assert!(h.sched.files().workers().all(|w| w != workers[0]));
    assert!(h.sched.audit().is_empty(), "{:?}", h.sched.audit());
}
