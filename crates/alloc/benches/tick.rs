//! The allocator's own cost (issue 14, benchmark 3): one tick of a queue with 1,000
//! allocations while 1M tasks wait. Goal: at most 1 ms.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kestrel_alloc::{Acquire, Allocator, Demand, QueueParams};

const S: u64 = 1_000_000;

/// A queue with `n` running one-node allocations (worker i in allocation i), half of whose
/// workers are idle, but not for long enough to be released.
fn allocator(n: u32) -> Allocator {
    let mut al = Allocator::new();
    let p = QueueParams {
        acquire: Acquire::One,
        backlog: n,
        idle_timeout_us: Some(3600 * S),
        ..QueueParams::new(24 * 3600 * S, 4)
    };
    let q = al.add_queue(p).expect("queue");
    for t in 0..u64::from(n) {
        let acts = al.tick(t, |_| Demand {
            queued_tasks: 1 << 40,
            queued_slots: 1 << 40,
            ..Demand::default()
        });
        for a in acts {
            if let kestrel_alloc::Action::Submit { alloc, .. } = a {
                let queue = al.queue_mut(q).expect("queue");
                queue.submitted(alloc, format!("{alloc}"));
                queue.worker_joined(t, alloc, alloc);
            }
        }
    }
    al
}

fn tick(c: &mut Criterion) {
    let al = allocator(1000);
    assert_eq!(al.queues().next().map(|q| q.live().count()), Some(1000));
    let demand = Demand {
        queued_tasks: 1_000_000,
        queued_slots: 1_000_000,
        free_slots: 0,
        idle: (1..=1000).step_by(2).map(|w| (w, 10 * S)).collect(),
        covered_elsewhere: 0,
    };
    c.bench_function("tick: 1,000 allocations, 1M queued tasks", |b| {
        b.iter_batched(
            || al.clone(),
            |mut al| al.tick(2000 * S, |_| demand.clone()),
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, tick);
criterion_main!(benches);
