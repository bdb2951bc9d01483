#!/usr/bin/env python3
"""Tests of eviction_render's between-methods matrix and its cost estimate (ctest docs_eviction_render_test), on
synthetic results: no kvx run, no committed file read."""
import os, sys, unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eviction_render  # noqa: E402

N, RATIO = 2048, 0.5


def cell(hits_on):
    """A passkey cell of 50 prompts, hits on the prompt ids in hits_on."""
    prompts = {i: i in hits_on for i in range(50)}
    return {"n": 50, "hits": sum(prompts.values()), "prompts": prompts, "peak": 100}


def data(cells):
    return {"passkey": {(m, RATIO, N): c for m, c in cells.items()}, "f16_bytes": {N: 200}}


class Pairwise(unittest.TestCase):
    def test_same_prompts_share_a_row_and_far_rates_do_not(self):
        d = data({"a": cell(range(50)), "b": cell(range(50)), "zero": cell(())})
        rows = {m: same for m, _, same in eviction_render.pairwise(d, RATIO, N)}
        self.assertEqual(rows, {"a": ["b"], "b": ["a"], "zero": []})
        table = eviction_render.pairwise_section(d, N)
        self.assertIn("| a 100% [93–100] (50%); b 100% [93–100] (50%) | none |", table)  # one row: a clique
        self.assertIn("| zero 0% [0–7] (50%) | none |", table)

    def test_the_family_is_every_pair(self):
        # 9 prompts only "a" retrieves: exact McNemar p = 2^-8 = 0.0039, significant alone, not after Holm over
        # the 21 pairs of 7 methods (0.05 / 21 = 0.0024)
        two = {"a": cell(range(50)), "b": cell(range(9, 50))}
        self.assertEqual(eviction_render.pairwise(data(two), RATIO, N)[0][2], [])
        seven = dict(two, **{"c%d" % i: cell(range(50)) for i in range(5)})
        rows = {m: same for m, _, same in eviction_render.pairwise(data(seven), RATIO, N)}
        self.assertIn("b", rows["a"])


class EqualQuality(unittest.TestCase):
    def test_equal_needs_the_kld_bound_and_retrieval_not_worse(self):
        ctx = eviction_render.KLD_CONTEXTS[0]
        kld = lambda mean: {"mean": mean, "peak": 100}
        d = data({"both": cell(range(50)), "kld only": cell(()), "retrieval only": cell(range(50))})
        d["kld"] = {("both", RATIO, ctx): kld(0.001), ("kld only", RATIO, ctx): kld(0.001),
                    ("retrieval only", RATIO, ctx): kld(0.05)}
        d["f16_bytes"][("kld", ctx)] = 200
        verdict = {("both", RATIO, N): (1.0, "indistinguishable"), ("kld only", RATIO, N): (1e-15, "worse"),
                   ("retrieval only", RATIO, N): (1.0, "indistinguishable")}
        row = [line for line in eviction_render.equal_quality_section(d, verdict) if line.startswith("| %g |" % RATIO)]
        self.assertEqual(len(row), 1)
        equal, kld_only = row[0].split(" | ")[1:3]
        self.assertTrue(equal.startswith("both (50%, KLD 0.0010, passkey 100% [93–100] at 2048)"), equal)
        self.assertTrue(kld_only.startswith("kld only "), kld_only)
        self.assertNotIn("retrieval only", row[0])


class Cost(unittest.TestCase):
    PACE = {("passkey", "shared"): (20.0, 10), ("passkey", "full"): (100.0, 4), ("kld", "g"): (5.0, 7)}

    def test_a_run_costs_its_specs_and_baseline_scaled_by_length(self):
        short = eviction_render.run_cost(self.PACE, "passkey", 2048, "full", 3)
        self.assertAlmostEqual(short, 4 * 100.0 * 2.048)
        self.assertAlmostEqual(eviction_render.run_cost(self.PACE, "passkey", 4096, "full", 3), 2 * short)

    def test_kld_batches_are_one_group_and_unknown_groups_take_the_kinds_median(self):
        self.assertAlmostEqual(eviction_render.run_cost(self.PACE, "kld", 1000, "g3", 6), 7 * 5.0)
        self.assertAlmostEqual(eviction_render.run_cost(self.PACE, "passkey", 1000, "int4", 1), 2 * 60.0)
        self.assertIsNone(eviction_render.run_cost({}, "passkey", 1000, "int4", 1))


if __name__ == "__main__":
    unittest.main()
