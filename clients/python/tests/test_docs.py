"""Every SQLSTATE the documentation lists, and every code of src/base/ds_errcodes.h, has its
class. Needs the tree's docs/ and src/ (examples/run-tests copies them); needs no cluster."""
import os
import re
import unittest

import durable_steps_client as ds

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
# (file, the heading of its section of SQLSTATE tables)
TABLES = [("docs/reference.md", "## SQLSTATEs"), ("docs/idempotent-requests.md", "## Errors"),
          ("docs/schedules.md", "## Errors")]


def documented():
    codes = {}
    for name, heading in TABLES:
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        section = text[text.index(heading + "\n"):]
        end = section.find("\n## ", 1)
        section = section if end < 0 else section[:end]
        for line in section.splitlines():
            if line.startswith("| `"):
                first = line.split("|")[1]
                for code in re.findall(r"`([0-9A-Z]{5})`", first):
                    codes.setdefault(code, name)
    return codes


class Documented(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(os.path.join(ROOT, "docs", "reference.md")):
            self.skipTest("no docs/ beside clients/ (an installed copy of the package)")

    def test_every_documented_sqlstate_has_its_class(self):
        codes = documented()
        self.assertGreaterEqual(len(codes), 35)
        missing = {c: f for c, f in codes.items() if c not in ds.BY_SQLSTATE}
        self.assertEqual(missing, {})
        # and no class stands for a code the documentation does not list
        self.assertEqual(sorted(set(ds.BY_SQLSTATE) - set(codes)), [])

    def test_every_code_of_ds_errcodes_h_has_its_class(self):
        with open(os.path.join(ROOT, "src", "base", "ds_errcodes.h")) as f:
            header = f.read()
        codes = {"".join(parts) for parts in
                 re.findall(r"MAKE_SQLSTATE\('(.)',\s*'(.)',\s*'(.)',\s*'(.)',\s*'(.)'\)", header)}
        self.assertGreaterEqual(len(codes), 20)
        self.assertEqual(sorted(codes - set(ds.BY_SQLSTATE)), [])


def documented_http_statuses():
    """docs/reference.md "HTTP statuses": {SQLSTATE: status}."""
    with open(os.path.join(ROOT, "docs", "reference.md")) as f:
        text = f.read()
    section = text[text.index("### HTTP statuses\n"):]
    end = section.find("\n#", 1)
    section = section if end < 0 else section[:end]
    statuses = {}
    for line in section.splitlines():
        m = re.match(r"\| (\d{3}) \| (.*) \|$", line)
        if m:
            for code in re.findall(r"`([0-9A-Z]{5})`", m.group(2)):
                statuses[code] = int(m.group(1))
    return statuses


class HttpStatuses(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(os.path.join(ROOT, "docs", "reference.md")):
            self.skipTest("no docs/ beside clients/ (an installed copy of the package)")

    def test_every_class_answers_the_documented_status(self):
        statuses = documented_http_statuses()
        self.assertGreaterEqual(len(statuses), 40)
        self.assertEqual(sorted(set(ds.BY_SQLSTATE) - set(statuses)), [])
        wrong = {code: (cls.http_status, statuses.get(code)) for code, cls in ds.BY_SQLSTATE.items()
                 if cls.http_status != statuses.get(code)}
        self.assertEqual(wrong, {})
