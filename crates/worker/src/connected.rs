//! What a worker reports when it registers with a server, so that `kestrel worker start` can
//! say where it connected and with what (see [`crate::WorkerConfig::on_connect`]).

use crate::WorkerConfig;
use kestrel_core::WorkerId;
use std::fmt;

/// One registration of a worker with a server.
#[derive(Debug, Clone)]
pub struct Connected<'a> {
    /// The id the server gave this worker.
    pub worker: WorkerId,
    /// The `host:port` the worker connected to.
    pub address: String,
    /// What the worker offers (slots, GPUs, memory...) and its server directory.
    pub config: &'a WorkerConfig,
    /// `None` on the first registration; after a reconnection, what became of the tasks that
    /// ran on and the results collected while the connection was down.
    pub handover: Option<Handover>,
}

/// What a reconnecting worker did with its carried tasks and results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The same server: they were handed over to it.
    Resumed { running: usize, results: usize },
    /// Another server (a new server id): they belong to jobs it does not know, so the tasks
    /// were stopped and the results dropped.
    Dropped { running: usize, results: usize },
}

impl fmt::Display for Connected<'_> {
    /// One line, e.g. `worker 3 connected to h:7000 (server dir /srv/k) with 8 slots, 0 GPUs,
    /// 15.5 GiB memory, prefetch 8`; a reconnection also says what became of the carried tasks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.handover {
            None => "connected",
            Some(_) => "reconnected",
        };
        write!(f, "worker {} {verb} to {}", self.worker, self.address)?;
        let c = self.config;
        if let Some(dir) = &c.server_dir {
            write!(f, " (server dir {dir})")?;
        }
        write!(
            f,
            " with {} slot{}, {} GPU{}",
            c.slots,
            plural(c.slots as usize),
            c.gpus.len(),
            plural(c.gpus.len()),
        )?;
        if !c.gpus.is_empty() {
            write!(f, " ({})", crate::gpu::describe(&c.gpus))?;
        }
        write!(f, ", {} memory", memory(c.mem))?;
        for (name, count) in &c.named {
            write!(f, ", {name}={count}")?;
        }
        write!(f, ", prefetch {}", c.prefetch)?;
        if let Some(p) = &c.python {
            write!(f, ", Python {}", p.display())?;
        }
        match self.handover {
            None => Ok(()),
            Some(Handover::Resumed { running, results }) => write!(
                f,
                "; handed over {running} running task{} and {results} result{}",
                plural(running),
                plural(results)
            ),
            Some(Handover::Dropped { running, results }) => write!(
                f,
                "; a different server: stopped {running} running task{} and dropped {results} result{} of the previous one",
                plural(running),
                plural(results)
            ),
        }
    }
}

/// Bytes in GiB with one decimal, or in MiB below 1 GiB.
fn memory(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WorkerConfig {
        let mut c = WorkerConfig::new(8);
        c.server_dir = Some("/srv/k".into());
        c.gpus = crate::gpu::Gpu::numbered(1);
        c.mem = 31 << 29;
        c
    }

    fn connected(config: &WorkerConfig, handover: Option<Handover>) -> Connected<'_> {
        Connected {
            worker: 3,
            address: "h:7000".into(),
            config,
            handover,
        }
    }

    #[test]
    fn first_registration_and_reconnections_read_as_one_line() {
        let c = config();
        assert_eq!(
            connected(&c, None).to_string(),
            "worker 3 connected to h:7000 (server dir /srv/k) with 8 slots, 1 GPU (0), 15.5 GiB memory, prefetch 8"
        );
        let mut small = config();
        small.mem = 512 << 20;
        small.named = vec![("licenses".into(), 4)];
        assert!(connected(&small, None)
            .to_string()
            .ends_with("1 GPU (0), 512 MiB memory, licenses=4, prefetch 8"));
        let resumed = Handover::Resumed {
            running: 1,
            results: 0,
        };
        assert_eq!(
            connected(&c, Some(resumed)).to_string(),
            "worker 3 reconnected to h:7000 (server dir /srv/k) with 8 slots, 1 GPU (0), 15.5 GiB memory, prefetch 8; \
             handed over 1 running task and 0 results"
        );
        let dropped = Handover::Dropped {
            running: 2,
            results: 1,
        };
        assert!(connected(&c, Some(dropped)).to_string().ends_with(
            "a different server: stopped 2 running tasks and dropped 1 result of the previous one"
        ));
    }
}
