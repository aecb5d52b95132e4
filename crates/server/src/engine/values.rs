//! Clients' requests about values (protocol 14; see `kestrel_core::values`): where a value is
//! cached, which worker to put one on, the values a client put there, and those it drops.
//! The bytes of values never come here: clients and workers move them over the workers' peer
//! ports.

use super::Engine;
use kestrel_core::values::{self, ValueKind};
use kestrel_core::{Event, Reply, WorkerId};
use kestrel_proto::messages::{Answer, FileSources, Refusal};

/// The most files one `Locate` or `Placed` may name, and the most holders told per file.
const MAX_FILES: usize = 10_000;
const MAX_HOLDERS: usize = 8;

impl Engine {
    /// The workers that hold each of `files` and serve their caches, by URL.
    pub(super) fn locate(&self, files: Vec<String>) -> Result<Answer, Refusal> {
        if files.len() > MAX_FILES {
            return Err(too_many(files.len()));
        }
        let located = files
            .into_iter()
            .filter_map(|file| {
                let peers: Vec<String> = self
                    .core
                    .holders_of(&file)
                    .iter()
                    .filter_map(|w| self.conns.workers.get(w)?.serves.clone())
                    .take(MAX_HOLDERS)
                    .collect();
                (!peers.is_empty()).then_some(FileSources { file, peers })
            })
            .collect();
        Ok(Answer::Located(located))
    }

    /// A worker to put a value of `bytes` bytes on: one that runs Python, serves its cache,
    /// whose cache can hold it, and that is neither quarantined nor leaving; the next such
    /// worker each time, so values spread over them.
    pub(super) fn place(&mut self, bytes: u64) -> Result<Answer, Refusal> {
        let mut fitting: Vec<(WorkerId, &str)> = self
            .conns
            .workers
            .iter()
            .filter(|(id, c)| {
                c.python.is_some()
                    && c.cache_capacity.is_some_and(|cap| cap >= bytes)
                    && !self.leaving.contains_key(id)
                    && self
                        .core
                        .worker(**id)
                        .is_some_and(|w| w.quarantined.is_none())
            })
            .filter_map(|(&id, c)| Some((id, c.serves.as_deref()?)))
            .collect();
        if fitting.is_empty() {
            let python = self.conns.workers.values().filter(|c| c.python.is_some());
            let largest = python.filter_map(|c| c.cache_capacity).max();
            return Err(Refusal::from(match largest {
                None => "no connected worker runs Python with a cache to hold the value: start one with `kestrel worker start --python PATH`".to_string(),
                Some(cap) => format!(
                    "a value of {bytes} bytes is more than the cache of any connected Python worker holds (the largest holds {cap}); give workers a larger --cache-size, or pass a file in the store (inputs=[...])"
                ),
            }));
        }
        fitting.sort_unstable_by_key(|&(id, _)| id);
        let (worker, url) = fitting[self.next_place % fitting.len()];
        let url = url.to_string();
        self.next_place = self.next_place.wrapping_add(1);
        Ok(Answer::Place { worker, url })
    }

    /// Values a client put on `worker`: named held by it from now on.
    pub(super) fn placed(
        &mut self,
        now: u64,
        worker: WorkerId,
        files: Vec<(String, u64)>,
    ) -> Result<Answer, Refusal> {
        if files.len() > MAX_FILES {
            return Err(too_many(files.len()));
        }
        if !self.conns.workers.contains_key(&worker) {
            return Err(Refusal::not_found(format!(
                "worker {worker} is not connected (it left since the value was put there): put it on another with `Place`"
            )));
        }
        if let Some((name, _)) = files.iter().find(|(n, _)| {
            !matches!(
                values::kind_of(n),
                Some(ValueKind::Argument | ValueKind::Scattered)
            )
        }) {
            return Err(Refusal::from(format!(
                "{name:?} is not the name of a value a client puts on a worker ({}a/ID or {}s/ID)",
                values::PREFIX,
                values::PREFIX
            )));
        }
        let placed = Event::CacheChanged {
            worker,
            added: files,
            evicted: Vec::new(),
        };
        match self.core.handle(now, placed) {
            Ok(_) => Ok(Answer::Placed),
            Err(e) => Err(e.into()),
        }
    }

    /// Values a client drops: their holders delete them.
    pub(super) fn drop_values(&mut self, now: u64, files: Vec<String>) -> Result<Answer, Refusal> {
        if files.len() > MAX_FILES {
            return Err(too_many(files.len()));
        }
        match self.core.handle(now, Event::DropValues { files }) {
            Ok(Reply::Dropped(held)) => Ok(Answer::ValuesDropped { held }),
            Ok(other) => Err(Refusal::from(format!(
                "internal error: the scheduler answered with {other:?}; please report it"
            ))),
            Err(e) => Err(e.into()),
        }
    }
}

fn too_many(n: usize) -> Refusal {
    Refusal::from(format!(
        "{n} files in one request; at most {MAX_FILES}: send them in several"
    ))
}
