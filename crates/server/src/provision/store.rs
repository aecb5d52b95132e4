//! The allocation queues and their allocations, kept in the server's journal file so that a
//! restarted server finds them again: each queue's spec and pause, each allocation as the
//! allocator last saw it, and the next ids. Unlike the scheduler's log these are small tables
//! rewritten in place (a queue makes at most one allocation a second), on a connection of
//! their own, so that an allocation is written, and synced, before its submit command runs.

use kestrel_alloc::{AllocId, Allocation, Paused, QueueId};
use kestrel_proto::messages::AllocQueueSpec;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

/// A queue as kept.
pub(super) struct SavedQueue {
    pub(super) id: QueueId,
    pub(super) spec: AllocQueueSpec,
    pub(super) paused: Option<Paused>,
    pub(super) allocations: Vec<Allocation>,
}

/// Everything kept.
#[derive(Default)]
pub(super) struct Saved {
    pub(super) queues: Vec<SavedQueue>,
    /// (next queue id, next allocation id).
    pub(super) next_ids: (QueueId, AllocId),
}

/// The tables in the journal file.
pub(super) struct Store {
    conn: Connection,
}

fn sql(e: rusqlite::Error) -> String {
    e.to_string()
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, String> {
    // Named fields: a field added later leaves older rows readable.
    rmp_serde::to_vec_named(v).map_err(|e| e.to_string())
}

impl Store {
    /// Opens the tables in the journal file `path` (created by the journal already).
    pub(super) fn open(path: &Path) -> Result<Store, String> {
        let conn = Connection::open(path).map_err(sql)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql)?;
        // The engine's own connection may hold the write lock for a moment.
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS alloc_queue(id INTEGER PRIMARY KEY, spec BLOB NOT NULL, paused BLOB);
             CREATE TABLE IF NOT EXISTS allocation(id INTEGER PRIMARY KEY, queue INTEGER NOT NULL, body BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS alloc_ids(key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;",
        )
        .map_err(sql)?;
        Ok(Store { conn })
    }

    /// What an earlier run kept. A row that cannot be read is an error naming it: the queues
    /// are not half restored.
    pub(super) fn load(&self) -> Result<Saved, String> {
        let mut saved = Saved::default();
        let mut st = self
            .conn
            .prepare("SELECT id, spec, paused FROM alloc_queue ORDER BY id")
            .map_err(sql)?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, Option<Vec<u8>>>(2)?,
                ))
            })
            .map_err(sql)?;
        for row in rows {
            let (id, spec, paused) = row.map_err(sql)?;
            let bad =
                |e: rmp_serde::decode::Error| format!("allocation queue {id} is unreadable: {e}");
            saved.queues.push(SavedQueue {
                id: QueueId::try_from(id).map_err(|e| format!("queue id {id}: {e}"))?,
                spec: rmp_serde::from_slice(&spec).map_err(bad)?,
                paused: paused
                    .map(|p| rmp_serde::from_slice(&p))
                    .transpose()
                    .map_err(bad)?,
                allocations: Vec::new(),
            });
        }
        let mut st = self
            .conn
            .prepare("SELECT id, queue, body FROM allocation ORDER BY id")
            .map_err(sql)?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                ))
            })
            .map_err(sql)?;
        for row in rows {
            let (id, queue, body) = row.map_err(sql)?;
            let a: Allocation = rmp_serde::from_slice(&body)
                .map_err(|e| format!("allocation {id} is unreadable: {e}"))?;
            if let Some(q) = saved.queues.iter_mut().find(|q| i64::from(q.id) == queue) {
                q.allocations.push(a);
            }
        }
        let id = |key: &str| -> Result<u32, String> {
            let v: Option<i64> = self
                .conn
                .query_row("SELECT value FROM alloc_ids WHERE key = ?1", [key], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(sql)?;
            Ok(v.and_then(|v| u32::try_from(v).ok()).unwrap_or(1))
        };
        saved.next_ids = (id("queue")?, id("alloc")?);
        Ok(saved)
    }

    /// Writes queue `id` (added, paused or resumed).
    pub(super) fn put_queue(
        &self,
        id: QueueId,
        spec: &AllocQueueSpec,
        paused: Option<&Paused>,
    ) -> Result<(), String> {
        let paused = paused.map(encode).transpose()?;
        self.conn
            .execute(
                "INSERT INTO alloc_queue(id, spec, paused) VALUES (?1, ?2, ?3) ON CONFLICT(id) DO UPDATE SET spec = excluded.spec, paused = excluded.paused",
                params![id, encode(spec)?, paused],
            )
            .map(drop)
            .map_err(sql)
    }

    /// Forgets queue `id` and its allocations.
    pub(super) fn remove_queue(&mut self, id: QueueId) -> Result<(), String> {
        let tx = self.conn.transaction().map_err(sql)?;
        tx.execute("DELETE FROM alloc_queue WHERE id = ?1", [id])
            .map_err(sql)?;
        tx.execute("DELETE FROM allocation WHERE queue = ?1", [id])
            .map_err(sql)?;
        tx.commit().map_err(sql)
    }

    /// Writes allocations (new or changed) and the next ids, in one transaction.
    pub(super) fn put_allocations(
        &mut self,
        rows: &[(QueueId, &Allocation)],
        (next_queue, next_alloc): (QueueId, AllocId),
    ) -> Result<(), String> {
        let tx = self.conn.transaction().map_err(sql)?;
        {
            let mut st = tx
                .prepare_cached(
                    "INSERT INTO allocation(id, queue, body) VALUES (?1, ?2, ?3) ON CONFLICT(id) DO UPDATE SET body = excluded.body",
                )
                .map_err(sql)?;
            for (queue, a) in rows {
                st.execute(params![a.id, queue, encode(a)?]).map_err(sql)?;
            }
            let mut ids = tx
                .prepare_cached(
                    "INSERT INTO alloc_ids(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                )
                .map_err(sql)?;
            ids.execute(params!["queue", next_queue]).map_err(sql)?;
            ids.execute(params!["alloc", next_alloc]).map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> AllocQueueSpec {
        AllocQueueSpec {
            backend: "slurm".into(),
            name: Some("gpu".into()),
            nodes: 2,
            slots_per_node: 4,
            time_limit_ms: 3_600_000,
            max_allocs: None,
            max_workers: Some(8),
            backlog: 1,
            idle_timeout_ms: Some(60_000),
            acquire: "additive".into(),
            worker_args: vec!["--slots".into(), "4".into()],
            batch_args: vec!["--partition=debug".into()],
            dry_run: true,
            release_below: Some(2),
        }
    }

    fn allocation(id: AllocId, batch_id: Option<&str>) -> Allocation {
        Allocation {
            id,
            nodes: 2,
            batch_id: batch_id.map(str::to_string),
            state: kestrel_alloc::AllocState::Queued,
            submitted_us: 1_000,
            started_us: None,
            ended_us: None,
            workers: vec![3, 4],
            workers_seen: 2,
            busy_cpu_us: 5_000_000,
            cancel_reason: None,
            restored_us: 0,
        }
    }

    #[test]
    fn queues_allocations_and_ids_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        {
            let mut s = Store::open(&path).unwrap();
            s.put_queue(1, &spec(), None).unwrap();
            s.put_queue(2, &spec(), Some(&Paused::Failing("why".into())))
                .unwrap();
            let a = allocation(7, Some("123"));
            let b = allocation(8, None);
            s.put_allocations(&[(1, &a), (2, &b)], (3, 9)).unwrap();
            // Rewritten in place, not added twice.
            let mut a2 = a.clone();
            a2.state = kestrel_alloc::AllocState::Running;
            s.put_allocations(&[(1, &a2)], (3, 10)).unwrap();
            s.put_queue(1, &spec(), Some(&Paused::ByUser)).unwrap();
        }
        let s = Store::open(&path).unwrap();
        let saved = s.load().unwrap();
        assert_eq!(saved.next_ids, (3, 10));
        assert_eq!(saved.queues.len(), 2);
        assert_eq!(saved.queues[0].spec, spec());
        assert_eq!(saved.queues[0].paused, Some(Paused::ByUser));
        assert_eq!(saved.queues[0].allocations.len(), 1);
        assert_eq!(
            saved.queues[0].allocations[0].state,
            kestrel_alloc::AllocState::Running
        );
        assert_eq!(saved.queues[1].allocations[0].batch_id, None);
        let mut s = s;
        s.remove_queue(2).unwrap();
        let saved = s.load().unwrap();
        assert_eq!(saved.queues.len(), 1);
    }

    #[test]
    fn an_unreadable_row_is_named_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        let s = Store::open(&path).unwrap();
        s.conn
            .execute("INSERT INTO alloc_queue(id, spec) VALUES (4, x'c1c1')", [])
            .unwrap();
        let e = s.load().err().unwrap();
        assert!(e.contains("allocation queue 4 is unreadable"), "{e}");
    }
}
