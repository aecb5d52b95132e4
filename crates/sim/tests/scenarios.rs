//! Scenarios through the simulator: what bad ones are told, and invariants at a scale no
//! machine of the test suite has (thousands of nodes failing, every task ending once).

use kestrel_sim::{run, Scenario};
use std::path::Path;

fn parse(text: &str) -> Result<Scenario, String> {
    Scenario::parse(text, Path::new("."))
}

const SMALL: &str = r#"
[cluster]
nodes = 4
cpus = 2
[workload]
tasks = 100
compute = "1s"
"#;

#[test]
fn a_fixed_workload_takes_the_time_its_cpus_need() {
    let s = parse(SMALL).expect("scenario");
    assert_eq!(s.runs.len(), 1);
    assert_eq!(s.runs[0].name, "main");
    let r = run(&s.runs[0], None).expect("run");
    assert_eq!((r.finished, r.failed), (100, 0));
    assert!(r.stopped.is_none());
    // 100 one-second tasks on 8 cpus: 13 waves.
    assert!((r.makespan_s - 13.0).abs() < 0.01, "{}", r.makespan_s);
}

#[test]
fn an_unknown_key_is_refused_naming_it_and_what_is_allowed() {
    let e = parse(&format!("{SMALL}\n[scheduler]\npolcy = \"fa\"\n")).unwrap_err();
    assert!(e.contains("polcy"), "{e}");
    assert!(e.contains("policy"), "{e}");
    // In a run's changes too, with the run named.
    let e = parse(&format!(
        "{SMALL}\n[[runs]]\nname = \"x\"\ncluster.cahce = \"1GB\"\n"
    ))
    .unwrap_err();
    assert!(
        e.contains("\"x\"") && e.contains("cahce") && e.contains("cache"),
        "{e}"
    );
    let e = parse(&format!("{SMALL}\n[scheduler]\npolicy = \"fastest\"\n")).unwrap_err();
    assert!(e.contains("fastest") && e.contains("gcc"), "{e}");
}

#[test]
fn impossible_values_are_refused_saying_what_is_allowed() {
    let rate = SMALL.replace(
        "compute = \"1s\"",
        "compute = \"1s\"\narrival = { pattern = \"rate\", rate = -5 }",
    );
    let e = parse(&rate).unwrap_err();
    assert!(
        e.contains("workload.arrival.rate") && e.contains("positive"),
        "{e}"
    );
    let cache = SMALL.replace(
        "compute = \"1s\"",
        "compute = \"1s\"\nfiles = 10\nfile_size = \"10MB\"\ninputs = 2",
    ) + "\n[[runs]]\nname = \"tiny\"\ncluster.cache = \"15MB\"\n";
    let e = parse(&cache).unwrap_err();
    assert!(e.contains("cluster.cache") && e.contains("20000000"), "{e}");
    let e = parse(&SMALL.replace("nodes = 4", "nodes = 4\nlink = \"-1Gbit/s\"")).unwrap_err();
    assert!(e.contains("positive"), "{e}");
    let e = parse(&SMALL.replace(
        "compute = \"1s\"",
        "compute = { dist = \"gama\", mean = \"1s\" }",
    ))
    .unwrap_err();
    assert!(e.contains("gama") && e.contains("gamma"), "{e}");
    let e = parse(&format!("{SMALL}\n[failures]\ntask = 1.5\n")).unwrap_err();
    assert!(e.contains("failures.task"), "{e}");
    let e = parse(&format!(
        "{SMALL}\n[[runs]]\nname = \"a\"\n[[runs]]\nname = \"a\"\n"
    ))
    .unwrap_err();
    assert!(e.contains("two runs"), "{e}");
}

#[test]
fn work_no_node_can_run_stops_and_says_why() {
    let s =
        parse(&SMALL.replace("compute = \"1s\"", "compute = \"1s\"\ncpus = 8")).expect("scenario");
    let r = run(&s.runs[0], None).expect("run");
    assert_eq!(r.finished, 0);
    let why = r.stopped.expect("it cannot end");
    assert!(why.contains("nothing more can happen"), "{why}");
    assert!(why.contains("8 cpus") && why.contains("2 cpus"), "{why}");
}

#[test]
fn a_run_past_its_time_bound_stops_there_and_says_so() {
    let s = parse(&format!("time_limit = \"5s\"\n{SMALL}")).expect("scenario");
    let r = run(&s.runs[0], None).expect("run");
    let why = r.stopped.expect("it stops");
    assert!(why.contains("time bound"), "{why}");
    assert!(r.finished < 100 && r.finished > 0, "{}", r.finished);
    assert_eq!(r.makespan_s, 5.0);
}

/// Thousands of nodes, most of them killed mid-run, some coming back, runs failing at
/// random: every task still ends, exactly as many finish as there are, and a seed repeats.
#[test]
fn nothing_is_lost_when_thousands_of_nodes_fail() {
    let text = r#"
        seed = 3
        [cluster]
        nodes = 3000
        cpus = 2
        latency = "1ms"
        [workload]
        tasks = 30000
        compute = { dist = "gamma", mean = "20s", shape = 2 }
        retries = 10
        arrival = { pattern = "rate", rate = 500 }
        [failures]
        task = 0.02
        kill = [{ at = "20s", nodes = 1500 }, { at = "40s", nodes = 1000 }]
        return_after = "30s"
    "#;
    let s = parse(text).expect("scenario");
    let a = run(&s.runs[0], None).expect("run");
    assert!(a.stopped.is_none(), "{:?}", a.stopped);
    assert_eq!(a.finished + a.failed, 30_000);
    assert_eq!(a.failed, 0, "10 retries at 2% failures");
    assert_eq!(a.nodes_killed, 2500);
    assert!(a.runs_lost > 1000, "{}", a.runs_lost);
    assert!(a.runs_failed > 100, "{}", a.runs_failed);
    let b = run(&s.runs[0], None).expect("run");
    assert_eq!(a.makespan_s, b.makespan_s);
    assert_eq!(a.events, b.events);
    let c = run(&s.runs[0], Some(4)).expect("run");
    assert_ne!(a.makespan_s, c.makespan_s);
}

/// Data diffusion at the seeds' scale in shape: a cache that holds the working set serves
/// most inputs after the first reads; without one, every input comes from the store.
#[test]
fn caches_that_hold_the_working_set_take_the_load_off_the_store() {
    let text = r#"
        [cluster]
        nodes = 16
        cpus = 2
        link = "1Gbit/s"
        disk = "2Gbit/s"
        [store]
        bandwidth = "1Gbit/s"
        servers = 4
        [scheduler]
        policy = "gcc"
        [workload]
        tasks = 20000
        compute = "10ms"
        files = 500
        file_size = "1MB"
        [[runs]]
        name = "none"
        scheduler.policy = "fa"
        cluster.cache = "0"
        [[runs]]
        name = "cached"
        cluster.cache = "100MB"
    "#;
    let s = parse(text).expect("scenario");
    let none = run(&s.runs[0], None).expect("run");
    let cached = run(&s.runs[1], None).expect("run");
    assert_eq!(none.data.store_reads, 20_000);
    assert_eq!(none.data.hit_ratio, Some(0.0));
    assert!(cached.data.store_reads < 2_000, "{:?}", cached.data);
    assert!(
        cached.makespan_s * 3.0 < none.makespan_s,
        "{} vs {}",
        cached.makespan_s,
        none.makespan_s
    );
}

/// The scenarios docs/simulation.md runs read, with the runs it names.
#[test]
fn the_example_scenarios_read_with_the_runs_the_doc_names() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sim");
    let names = |file: &str| {
        Scenario::load(&dir.join(file))
            .expect("scenario")
            .runs
            .into_iter()
            .map(|r| r.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names("falkon-mi.toml"),
        ["fa", "gcc-1g", "gcc-1.5g", "gcc-2g", "gcc-4g", "mch-4g", "mcu-4g"]
    );
    assert_eq!(names("sc08-1m.toml"), ["sc08-1m"]);
    assert_eq!(
        names("diffusion-mi.toml"),
        ["fa-no-cache", "fa", "mch", "mcu", "gcc"]
    );
    assert_eq!(names("sc08-efficiency.toml").len(), 13);
}
