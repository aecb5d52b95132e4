//! The `kestrel` command: parses arguments, calls into the server, worker and protocol crates,
//! and prints results. It is a library so that the same command runs from the `kestrel`
//! binary (`main.rs`) and from the Python package's native module (`python -m kestrel`).

mod alloc;
mod args;
mod cat;
mod client_cmds;
mod completions;
mod exit;
mod gpus;
mod graph_dot;
mod graph_file;
mod jobs;
mod json;
mod keep_order;
mod output;
mod queries;
mod run;
mod run_dirs;
mod server_tls;
mod session;
mod sim;
mod sizes;
mod workers;

use anyhow::{bail, Context, Result};
use args::{Cli, Command, Exec, Global, ServerCommand, WorkerCommand};
use clap::Parser;
use kestrel_proto::default_server_dir;
use std::process::ExitCode;

/// Runs the command `args` names (the program's name first, as `std::env::args_os` gives it)
/// and returns its exit status. A program that can be started as a worker's reaper calls
/// [`kestrel_worker::reaper::serve_if_reaper`] before; one that cannot (a Python interpreter)
/// does not, and its workers fork their reapers instead.
pub fn main_with(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let server = matches!(cli.command, Command::Server(ServerCommand::Start(_)));
    init_logging(cli.global.verbose, server);
    if !hosts_a_worker_or_server(&cli.command) {
        // A command that only prints dies quietly when its reader goes away (`| head`), as
        // other tools do, instead of panicking in println!. Rust ignores SIGPIPE by default;
        // servers and workers keep it so (they write to pipes and sockets that may close).
        // SAFETY: setting a signal's disposition to the default before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return exit::code(exit::ERROR);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            // An error may quote what a server or a task said.
            eprintln!(
                "error: {}",
                output::escape_controls(&format!("{e:#}"), true)
            );
            exit::code(exit::code_of(&e))
        }
    }
}

/// Whether a command runs a server or workers in this process (`server start`, `worker
/// start`, `run`).
fn hosts_a_worker_or_server(c: &Command) -> bool {
    matches!(
        c,
        Command::Run(_)
            | Command::Server(ServerCommand::Start(_))
            | Command::Worker(WorkerCommand::Start { .. })
    )
}

/// Logs go to stderr: warnings by default; a server also says what happens to its workers and
/// jobs (joined, lost, submitted, done), which is what its log is read for.
fn init_logging(verbose: u8, server: bool) {
    let default = match verbose {
        0 if server => "warn,kestrel_server=info",
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in log files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .ok();
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let g = cli.global;
    match cli.command {
        Command::Run(a) => run::run(&g, a).await,
        Command::Submit(a) => client_cmds::submit(&g, a).await,
        Command::Job(c) => client_cmds::job(&g, c).await,
        Command::Task(c) => queries::task(&g, c).await,
        Command::Alloc(c) => alloc::alloc(&g, c).await,
        Command::Completions { shell } => Ok(completions::print(shell)),
        Command::Sim(a) => sim::sim(g.output, a),
        Command::Worker(WorkerCommand::List { all }) => workers::worker_list(&g, all).await,
        Command::Worker(WorkerCommand::Info { worker }) => workers::worker_info(&g, worker).await,
        Command::Worker(WorkerCommand::Stop { workers, all, now }) => {
            workers::worker_stop(&g, workers, all, now).await
        }
        Command::Worker(WorkerCommand::Resume { worker }) => {
            workers::worker_resume(&g, worker).await
        }
        Command::Worker(WorkerCommand::Start {
            slots,
            gpus,
            mem,
            resource,
            prefetch,
            exec,
            cache_dir,
            cache_size,
            cache_policy,
            store_readers,
            peer_listen,
            ends_at,
            alloc,
            group,
            python,
        }) => {
            let offer = Offer {
                ends_at,
                alloc,
                group,
                python,
                slots,
                gpus,
                mem,
                resource,
                prefetch,
                cache: kestrel_worker::CacheConfig {
                    dir: cache_dir,
                    capacity: match cache_size.as_deref().map(str::trim) {
                        // No caching: every input is streamed to its task from the store.
                        Some("0") => 0,
                        Some(s) => jobs::parse_size(s)
                            .with_context(|| format!("--cache-size {s:?}"))?,
                        None => kestrel_worker::CacheConfig::default().capacity,
                    },
                    policy: kestrel_worker::cache::EvictionPolicy::parse(&cache_policy)
                        .ok_or_else(|| {
                            anyhow::anyhow!(
                                "--cache-policy {cache_policy:?} is not one of lru, fifo, lfu, random"
                            )
                        })?,
                    store_readers,
                    peers: parse_peer_listen(peer_listen.as_deref())?,
                },
            };
            worker_start(&g, offer, exec).await
        }
        Command::Server(ServerCommand::Start(args)) => server_start(&g, *args).await,
        Command::Server(ServerCommand::Stop) => client_cmds::server_stop(&g).await,
        Command::Server(ServerCommand::Info) => client_cmds::server_info(&g).await,
    }
}

async fn server_start(g: &Global, args: args::ServerStartArgs) -> Result<ExitCode> {
    let args::ServerStartArgs {
        host,
        port,
        advertise,
        heartbeat,
        dir,
        no_journal,
        journal_limit,
        quarantine,
        store,
        policy,
        util_threshold,
        window,
        new_secret,
        handshake_timeout,
        tls,
    } = args;
    let store = match store {
        Some(s) => Some(jobs::store_location(&std::env::current_dir()?, &s)?),
        None => None,
    };
    let journal_limit = journal_limit
        .as_deref()
        .map(jobs::parse_size)
        .transpose()
        .context("--journal-limit")?;
    let dir = dir
        .or_else(|| g.server_dir.clone())
        .unwrap_or_else(default_server_dir);
    let advertise = advertise.unwrap_or_else(|| {
        if host == "0.0.0.0" || host == "::" {
            kestrel_worker::hostname()
        } else {
            host.clone()
        }
    });
    let tls_config = server_tls::choose(&host, tls)?;
    let transport = server_tls::describe(&host, &tls_config);
    let config = kestrel_server::ServerConfig {
        dir: dir.clone(),
        bind_host: host,
        port,
        advertise_host: advertise,
        heartbeat: jobs::parse_duration(&heartbeat).context("--heartbeat")?,
        journal: !no_journal,
        journal_limit: journal_limit.filter(|_| !no_journal),
        tls: tls_config,
        quarantine: quarantine == args::Switch::On,
        // After the `job-N` output directories here, so that a new server's job 1 does not
        // write into an earlier run's `job-1/`.
        first_job: run_dirs::first_free(&std::env::current_dir()?),
        store,
        policy: jobs::parse_policy(&policy)?,
        util_threshold_permille: jobs::util_threshold(util_threshold)?,
        window: match window {
            Some(0) => bail!("--window 0 would place no task by its data; give at least 1 (the default is 100 per worker)"),
            w => w,
        },
        run_record: false,
        new_secret,
        write_timeout: kestrel_server::WRITE_TIMEOUT,
        handshake_timeout: match jobs::parse_duration(&handshake_timeout)
            .context("--handshake-timeout")?
        {
            d if d < std::time::Duration::from_millis(100) => {
                bail!("--handshake-timeout {handshake_timeout} is too short for any peer to prove the secret; give at least 100ms (the default is 10s)")
            }
            d => d,
        },
    };
    let first_job = config.first_job;
    let server = kestrel_server::start(config).await?;
    if first_job > 1 && server.restored.as_ref().is_none_or(|(r, _)| r.jobs == 0) {
        eprintln!("jobs are numbered from {first_job}, after the job-N output directories here");
    }
    if let Some((r, took)) = &server.restored {
        eprintln!(
            "restored {} job(s) and {} task result(s) from the journal in {:.2?}",
            r.jobs, r.task_ends, took
        );
    }
    eprintln!(
        "kestrel server listening on {} ({transport}; access file {})",
        server.access.address(),
        server.access_path.display()
    );
    server_until_stopped(server).await;
    eprintln!("kestrel server stopped");
    Ok(ExitCode::SUCCESS)
}

/// Runs until a client asks to stop or the process gets SIGINT/SIGTERM.
async fn server_until_stopped(server: kestrel_server::RunningServer) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    let stop = server.stop_handle();
    let waiting = server.wait();
    tokio::pin!(waiting);
    tokio::select! {
        _ = &mut waiting => return,
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated => {}
    }
    stop.stop();
    waiting.await;
}

/// What `worker start` offers to tasks.
struct Offer {
    /// When its allocation ends (seconds since the epoch), and which allocation that is.
    ends_at: Option<u64>,
    alloc: Option<u32>,
    /// The workers a multi-node task may span with it.
    group: Option<String>,
    /// The Python that calls function tasks.
    python: Option<std::path::PathBuf>,
    slots: Option<u32>,
    gpus: Option<String>,
    mem: Option<String>,
    resource: Vec<String>,
    prefetch: Option<u32>,
    cache: kestrel_worker::CacheConfig,
}

async fn worker_start(g: &Global, offer: Offer, exec: Exec) -> Result<ExitCode> {
    // Absolute, so tasks in other directories get a usable KESTREL_SERVER_DIR.
    let path = session::access_path(g);
    let path = path
        .canonicalize()
        .or_else(|_| std::path::absolute(&path))
        .unwrap_or(path);
    let access = session::read_access(g)?;
    let slots = offer.slots.unwrap_or_else(cpus).max(1);
    let mut config = kestrel_worker::WorkerConfig::new(slots);
    let (gpus, how) = gpus::choose(
        offer.gpus.as_deref(),
        &kestrel_worker::gpu::Probe::machine(),
    )?;
    for found in how {
        eprintln!("found GPUs: {found}");
    }
    config.gpus = gpus;
    if let Some(m) = &offer.mem {
        config.mem = jobs::parse_size(m).with_context(|| format!("--mem {m:?}"))?;
    }
    config.named = jobs::parse_named(&offer.resource)?;
    config.prefetch = offer.prefetch.unwrap_or(slots);
    config.cache = Some(offer.cache);
    config.ends_at_s = offer.ends_at;
    config.alloc = offer.alloc;
    config.group = offer.group.filter(|g| !g.is_empty());
    config.python = offer.python;
    config.exec = exec.into();
    config.reconnect_for = session::reconnect_for(g, session::WORKER)?;
    config.server_dir = path.parent().map(|p| p.display().to_string());
    config.access_file = Some(path);
    // Where it connected and with what, on every (re)registration; `run`'s workers stay quiet.
    // One write per line: `eprintln!` writes a formatted line in pieces, and a reader of the
    // log (a person's `tail -f`, a test) could see half of it.
    config.on_connect = Some(|connected| {
        let line = format!("{connected}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    });
    config.on_stop = Some(|reason| {
        let line = format!("worker stopped: {reason}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    });
    config.stop = Some(stop_on_signals());
    if exec == Exec::Noop {
        eprintln!("warning: --exec noop completes tasks WITHOUT running them (benchmark mode)");
    }
    // SIGTERM and Ctrl-C are caught (`stop_on_signals`), so the worker ends through `run`
    // whatever stops it: its scratch cache directory goes with it.
    kestrel_worker::run(config, access).await?;
    Ok(ExitCode::SUCCESS)
}

/// What signals ask of a worker: SIGTERM (a batch system's scancel, a node's shutdown, `kill`)
/// drains it: it takes no new task, gives back those not started, and exits once its running
/// tasks end; SIGINT (Ctrl-C), or a second SIGTERM, stops it at once: its tasks are killed and
/// go back to the queue without spending a retry. Each is said on stderr as it comes.
fn stop_on_signals() -> tokio::sync::watch::Receiver<kestrel_worker::StopAsk> {
    use kestrel_worker::StopAsk;
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = tokio::sync::watch::channel(StopAsk::Run);
    let say = |line: &str| {
        let line = format!("{line}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    };
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        say("warning: cannot catch SIGTERM and SIGINT: they stop the worker at once, as SIGKILL would (its reaper kills its tasks)");
        return rx;
    };
    tokio::spawn(async move {
        let mut draining = false;
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if name == "SIGTERM" && !draining {
                draining = true;
                say("worker got SIGTERM: it takes no new task, gives back those it has not started, and exits once its running tasks end (SIGTERM again or Ctrl-C stops it at once)");
                let _ = tx.send(StopAsk::Drain("the worker got SIGTERM".into()));
                continue;
            }
            say(&format!("worker got {name}: stopping at once; its running tasks are killed and go back to the queue"));
            let _ = tx.send(StopAsk::Now(format!(
                "the worker got {name} and stopped at once; its tasks went back to the queue"
            )));
            // Kept alive: the worker may still read the channel while it stops.
            std::future::pending::<()>().await;
        }
    });
    rx
}

/// Number of CPUs this process may use.
pub fn cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// `--peer-listen`: `off`, or an address and port to serve the cache to peers on.
fn parse_peer_listen(text: Option<&str>) -> anyhow::Result<kestrel_worker::PeerListen> {
    use kestrel_worker::PeerListen;
    let Some(text) = text.map(str::trim) else {
        return Ok(PeerListen::Auto);
    };
    if text.eq_ignore_ascii_case("off") {
        return Ok(PeerListen::Off);
    }
    std::net::ToSocketAddrs::to_socket_addrs(text)
        .ok()
        .and_then(|mut a| a.next())
        .map(PeerListen::At)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--peer-listen {text:?} is not HOST:PORT (e.g. 10.0.0.5:7100, or 0.0.0.0:0 for any port) nor `off`"
            )
        })
}
