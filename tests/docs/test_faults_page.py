"""docs/faults.md quotes the network fault benchmark's results file: its table is `doc_section` of
docs/results/netfaults.json, as `python -m recipes.benchmarks.faults network --report_only --doc docs/faults.md`
writes it."""

import json
import os

from helpers import REPO

from recipes.benchmarks.faults.network import DOC_BEGIN, DOC_END, doc_section


def test_the_faults_page_table_is_the_results_file():
    page = open(os.path.join(REPO, "docs", "faults.md"), encoding="utf-8").read()
    with open(os.path.join(REPO, "docs", "results", "netfaults.json"), encoding="utf-8") as f:
        report = json.load(f)
    section = page.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0].strip("\n")
    assert section == doc_section(report)
    assert len(report["scenarios"]) >= 7
