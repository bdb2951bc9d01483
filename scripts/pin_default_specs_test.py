#!/usr/bin/env python3
"""Tests of pin_default_specs (ctest docs_pin_default_specs_test): which stored spec strings change meaning with
issue 41's defaults and what they are rewritten to. The pinned forms parse to the old meaning: kv_spec_test.cc,
KVSpecTest.ExplicitOldSettingsRoundTrip, checks them against ParseKVSpec."""
import os, sys, tempfile, unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pin_default_specs  # noqa: E402


def read(path):
    with open(path) as f:
        return f.read()


def pinned(text):
    return pin_default_specs.pin_text(text)[0]


class Pin(unittest.TestCase):
    def test_a_codec_at_its_defaults_gets_its_old_setting(self):
        self.assertEqual(pinned("codec=int2"), "codec=int2,clip=0")
        self.assertEqual(pinned("codec=int4"), "codec=int4,rotate=none")
        self.assertEqual(pinned("codec=kivi4"), "codec=kivi4,page=128,group=64,residual=0,prerope=1")

    def test_keys_outside_the_setting_keep_it_and_get_pinned(self):
        self.assertEqual(pinned("codec=int4,sym=1"), "codec=int4,sym=1,rotate=none")
        self.assertEqual(pinned("codec=int2,outliers=0.01"), "codec=int2,outliers=0.01,clip=0")
        self.assertEqual(pinned("codec=int4,bits.0-3=k8v4,budget=1M"), "codec=int4,bits.0-3=k8v4,budget=1M,rotate=none")
        self.assertEqual(pinned("codec=kivi4,clip=1"), "codec=kivi4,clip=1,page=128,group=64,residual=0,prerope=1")

    def test_the_pin_goes_into_the_codec_group_before_any_policy(self):
        self.assertEqual(pinned("codec=int4;policy=mikv,ratio=0.5,mode=once"),
                         "codec=int4,rotate=none;policy=mikv,ratio=0.5,mode=once")
        self.assertEqual(pinned("codec=int2,policy=snapkv,ratio=0.5,page=4"),
                         "codec=int2,clip=0,policy=snapkv,ratio=0.5,page=4")  # page= there is the policy's

    def test_strings_that_name_the_setting_keep_their_meaning_and_text(self):
        for same in ["codec=int4,page=16", "codec=int2,page=16,clip=1", "codec=int4,group=64,sym=1",
                     "codec=int4,rotate=hadamard", "codec=int2,clip=1", "codec=int2,clip=0", "codec=kivi4,page=32",
                     "codec=kivi4,prerope=1", "codec=int8", "codec=kivi2", "codec=f16;policy=think",
                     "codec=int4,page=16;policy=duo,heads=docs/results/head_typing/recall-duo.json,retrieval=0.25",
                     "kv_codec=int4", "demote=int2", "codec=int4x", "codec=int4-ish"]:
            self.assertEqual(pinned(same), same)

    def test_specs_inside_json_markdown_and_code(self):
        self.assertEqual(pinned('{"spec": "codec=int4", "canonical": "codec=int4,page=16"}'),
                         '{"spec": "codec=int4,rotate=none", "canonical": "codec=int4,page=16"}')
        self.assertEqual(pinned("| `codec=int2` | 0.547 |"), "| `codec=int2,clip=0` | 0.547 |")
        self.assertEqual(pinned('lambda r: "codec=int4" + ";policy=mikv"'),
                         'lambda r: "codec=int4,rotate=none" + ";policy=mikv"')
        self.assertEqual(pinned("--kv codec=int2 --kv codec=int4,sym=1\n"),
                         "--kv codec=int2,clip=0 --kv codec=int4,sym=1,rotate=none\n")

    def test_pinning_twice_changes_nothing(self):
        once = pinned("codec=int2 codec=int4;policy=x codec=kivi4,sym=1")
        self.assertEqual(pinned(once), once)


class Files(unittest.TestCase):
    def test_check_reports_and_rewrite_fixes(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.json")
            with open(path, "w") as f:
                f.write('{"spec": "codec=int2"}')
            with open(os.path.join(d, "binary.json"), "wb") as f:
                f.write(b"codec=int2\xff")  # not UTF-8: left alone
            self.assertEqual(pin_default_specs.main(["--check", d]), 1)
            self.assertEqual(read(path), '{"spec": "codec=int2"}')
            self.assertEqual(pin_default_specs.main([d]), 0)
            self.assertEqual(read(path), '{"spec": "codec=int2,clip=0"}')
            self.assertEqual(pin_default_specs.main(["--check", d]), 0)


if __name__ == "__main__":
    unittest.main()
