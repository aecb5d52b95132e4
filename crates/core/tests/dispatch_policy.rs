//! The dispatch seam: a policy other than first-available decides where tasks go, and the
//! scheduler keeps the books whatever it decides.

mod common;

use common::{array, spec, Events};
use kestrel_core::*;
use std::sync::{Arc, Mutex};

fn offer(cpus: u32) -> WorkerOffer {
    WorkerOffer {
        hostname: "h".into(),
        resources: Resources {
            cpus,
            ..Resources::NONE
        },
        prefetch: 0,
        named: Vec::new(),
        stages_files: true,
        runs_functions: false,
    }
}

/// Each job's tasks go to one worker only (as a data-aware policy sends tasks where their
/// inputs are); workers are served from the highest id down. Every offer is written down.
#[derive(Debug)]
struct Homes {
    home: Vec<(JobId, WorkerId)>,
    offers: Arc<Mutex<Vec<Offer>>>,
    steals: bool,
}

impl DispatchPolicy for Homes {
    fn order_workers(&mut self, workers: &mut [WorkerId]) {
        workers.reverse();
    }

    fn window(&self) -> usize {
        8
    }

    fn take(&mut self, offer: &Offer) -> u32 {
        self.offers.lock().unwrap().push(*offer);
        let home = self.home.iter().find(|(j, _)| *j == offer.job);
        match home {
            // Asking for more than the room is clamped to the room.
            Some((_, w)) if *w == offer.worker => u32::MAX,
            _ => 0,
        }
    }

    fn steals(&self) -> bool {
        self.steals
    }
}

/// The runs each worker was assigned, in the order the Assign commands came.
fn assignments(commands: &[Command]) -> Vec<(WorkerId, Vec<IndexRun>)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Assign { worker, runs } => Some((*worker, runs.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_policy_decides_which_worker_takes_which_tasks() {
    let mut s = Scheduler::new(Config::default());
    let w1 = s.worker_joined(0, offer(2));
    let w2 = s.worker_joined(0, offer(2));
    let a = s.submit(0, spec("a"), array(4), false).unwrap();
    let b = s.submit(0, spec("b"), array(4), false).unwrap();
    let offers = Arc::new(Mutex::new(Vec::new()));
    s.set_dispatch_policy(Box::new(Homes {
        home: vec![(a, w2), (b, w1)],
        offers: offers.clone(),
        steals: true,
    }));
    s.take_commands();

    s.schedule(1);
    let given = assignments(&s.take_commands());
    let run = |job, first, count| IndexRun { job, first, count };
    // Worker 2 is served first and takes job a's first two tasks; worker 1 declines them and
    // takes job b's, further down the queue.
    assert_eq!(
        given,
        vec![(w2, vec![run(a, 0, 2)]), (w1, vec![run(b, 0, 2)])]
    );
    assert_eq!(s.job(a).unwrap().counts.assigned, 2);
    assert_eq!(s.job(b).unwrap().counts.assigned, 2);
    assert_eq!(s.queued(), 4);

    let offers = offers.lock().unwrap().clone();
    let o = |worker, job, first, len, room| Offer {
        worker,
        job,
        first,
        len,
        room,
    };
    // Free slots first: worker 2 sees job a (and, full after it, nothing more); worker 1 sees
    // what is left of a, then b. The prefetch pass offers nothing: no worker has a window.
    assert_eq!(
        offers,
        vec![o(w2, a, 0, 4, 2), o(w1, a, 2, 2, 2), o(w1, b, 0, 4, 2)]
    );
}

#[test]
fn tasks_no_worker_takes_stay_queued_and_the_walk_stops_at_the_window() {
    let mut s = Scheduler::new(Config::default());
    s.worker_joined(0, offer(2));
    // Twenty jobs whose home is a worker that never comes.
    let jobs: Vec<JobId> = (0..20)
        .map(|i| {
            s.submit(0, spec(&format!("j{i}")), array(1), false)
                .unwrap()
        })
        .collect();
    let offers = Arc::new(Mutex::new(Vec::new()));
    s.set_dispatch_policy(Box::new(Homes {
        home: jobs.iter().map(|&j| (j, 99)).collect(),
        offers: offers.clone(),
        steals: true,
    }));
    s.take_commands();

    s.schedule(1);
    assert!(assignments(&s.take_commands()).is_empty());
    assert_eq!(s.queued(), 20);
    // One walk (more is queued than the worker can hold, so slots and window fill in one)
    // looks at the window's 8 declined spans and one more, then stops: 9 offers, not 20.
    assert_eq!(offers.lock().unwrap().len(), 9);
}

/// Work stealing asks the policy: one that keeps a job on its home worker says no, and an idle
/// worker does not make the scheduler take back the tasks waiting on the home worker (they
/// would only be declined for the idle one and go home again, pass after pass).
#[test]
fn a_policy_that_keeps_tasks_home_turns_stealing_off() {
    let revokes = |steals: bool| {
        let mut s = Scheduler::new(Config::default());
        let home = s.worker_joined(
            0,
            WorkerOffer {
                prefetch: 2,
                ..offer(2)
            },
        );
        let idle = s.worker_joined(0, offer(2));
        let job = s.submit(0, spec("a"), array(8), false).unwrap();
        s.set_dispatch_policy(Box::new(Homes {
            home: vec![(job, home)],
            offers: Arc::new(Mutex::new(Vec::new())),
            steals,
        }));
        s.take_commands();
        s.schedule(1);
        let commands = s.take_commands();
        let given = assignments(&commands);
        assert!(given.iter().all(|(w, _)| *w != idle), "{given:?}");
        commands
            .iter()
            .filter(|c| matches!(c, Command::Revoke { .. }))
            .count()
    };
    assert_eq!(revokes(false), 0);
    assert!(revokes(true) > 0, "the default asks the waiting tasks back");
}
