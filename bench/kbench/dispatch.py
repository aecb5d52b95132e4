"""Scenarios of the dispatch path alone: `--exec noop` workers, 2 of them and many."""

from __future__ import annotations

from kbench.common import log
from kbench.measure import SuiteBase, show
from kbench.stats import measured, med


class DispatchScenarios(SuiteBase):
    """Scenarios `noop` and `workers`."""

    # --- scenario 2: noop ---

    def scenario_noop(self) -> None:
        w = self.cfg["noop_workers"]
        big = self.cfg["noop_counts"][-1]
        log(f"scenario noop: {w} noop workers; sweep of --slots with {big} tasks (1 run each)")
        sweep = []
        for slots in self.cfg["noop_tune_slots"]:
            s = self.attempt(f"noop slots={slots}", self.k_noop, big, w, slots)
            s["slots"], s["prefetch"] = slots, slots
            sweep.append(s)
            show(s, f"slots={slots} prefetch={slots}")
        good = [s for s in sweep if "error" not in s]
        chosen = max(good, key=lambda s: s["rate"])["slots"] if good else 1024
        log(f" chose --slots {chosen} (--prefetch {chosen}, the default) per worker")
        counts = {}
        for cnt in self.cfg["noop_counts"]:
            samples = self.repeat(f"{cnt} noop tasks", "noop", self.k_noop, cnt, w, chosen)
            counts[str(cnt)] = measured(samples)
        self.res["noop"] = {
            "workers": w,
            "slots": chosen,
            "prefetch": chosen,
            "sweep": sweep,
            "sweep_tasks": big,
            "counts": counts,
        }

    # --- scenario 5: many workers ---

    def scenario_workers(self) -> None:
        """200 workers against the 2-worker rate of scenario 2. Each configuration gets its best
        credit window, as scenario 2's sweep gives the 2 workers theirs; the run at the same
        total window as 2 workers shows what the window alone costs."""
        nw, n = self.cfg["scale_workers"], self.cfg["scale_tasks"]
        noop = self.res.get("noop")
        total_slots = (noop["slots"] if noop else 1024) * self.cfg["noop_workers"]
        same_window = max(1, round(total_slots / nw))
        log(f"scenario workers: {nw} noop workers; sweep of --slots with {n} tasks (1 run each)")
        sweep = []
        for slots in self.cfg["scale_tune_slots"]:
            x = self.attempt(f"workers slots={slots}", self.k_noop, n, nw, slots, name="scale")
            x["slots"] = slots
            sweep.append(x)
            show(x, f"slots={slots}", f"{nw} workers connected in {x.get('connect_s', 0):.1f} s")
        good = [x for x in sweep if "error" not in x]
        slots = max(good, key=lambda x: x["rate"])["slots"] if good else 64
        log(f" chose --slots {slots} per worker")
        samples = self.repeat(
            f"{nw} workers x --slots {slots}",
            "workers",
            self.k_noop,
            n,
            nw,
            slots,
            name="scale",
            describe=lambda x: show(
                x, extra=f"{nw} workers connected in {x.get('connect_s', 0):.1f} s"
            ),
        )
        log(f" same total window as 2 workers: --slots {same_window} (1 run each)")
        small = {
            str(w): self.attempt(
                "workers same window", self.k_noop, n, w, total_slots // w, name="scale"
            )
            for w in (self.cfg["noop_workers"], nw)
        }
        for w, x in small.items():
            show(x, f"{w} workers x --slots {total_slots // int(w)}")
        ref = med((noop or {}).get("counts", {}).get(str(n)))
        self.res["workers"] = measured(
            samples,
            workers=nw,
            slots=slots,
            prefetch=slots,
            tasks=n,
            ref_rate=ref,
            sweep=sweep,
            same_window={"total_slots": total_slots, "runs": small},
        )
