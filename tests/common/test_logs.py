"""`common/logs.py`: log lines never continue a progress bar's line; a save's per-file lines are left out."""

import io
import logging

from tqdm.std import tqdm
from transformers.utils import logging as hf_logging

from adloco_hf.common.logs import lines_above_the_bar, quiet_saves


def test_a_record_printed_while_a_bar_runs_gets_a_line_of_its_own():
    """In a file (not a terminal) the bar redraws `\\r179/200 [...]` without a newline; a record printed then was
    glued to it (`179/200 [...][transformers] round 9 ...`, issue 41)."""
    out = io.StringIO()
    logger = logging.getLogger("transformers")
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("[transformers] %(message)s"))
    logger.addHandler(handler)
    try:
        with lines_above_the_bar():
            assert handler not in logger.handlers  # wrapped while training
            bar = tqdm(total=10, file=out, mininterval=0)
            bar.update(3)
            logger.warning("round 1 (step 3) | instances 1")
            bar.update(3)
            logger.warning("round 2 (step 6) | instances 1")
            bar.close()
        assert handler in logger.handlers  # put back
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().split("\n")
    rounds = [line for line in lines if "round " in line]
    assert rounds == ["[transformers] round 1 (step 3) | instances 1", "[transformers] round 2 (step 6) | instances 1"]
    assert any("3/10" in line for line in lines) and any("6/10" in line for line in lines)


def test_without_the_block_the_record_is_glued_to_the_bar():
    """The check above can fail: the same output without `lines_above_the_bar`."""
    out = io.StringIO()
    logger = logging.getLogger("adloco_hf.tests.glued")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(out))
    bar = tqdm(total=10, file=out, mininterval=0)
    bar.update(3)
    logger.warning("round 1")
    bar.close()
    assert any(line.endswith("round 1") and "3/10" in line for line in out.getvalue().split("\n"))


def test_a_save_logs_no_line_per_file(tmp_path, records):
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_info()
    try:
        config_logger = logging.getLogger("transformers.configuration_utils")
        with quiet_saves():
            config_logger.info("Configuration saved in %s", tmp_path / ".tmp-checkpoint-10" / "config.json")
            assert not hf_logging.is_progress_bar_enabled()  # no "Writing model shards" bar
        config_logger.info("Configuration saved in %s", tmp_path / "config.json")
    finally:
        hf_logging.set_verbosity(verbosity)
    assert hf_logging.is_progress_bar_enabled()
    saved = [r.getMessage() for r in records.records if r.getMessage().startswith("Configuration saved in")]
    assert saved == [f"Configuration saved in {tmp_path / 'config.json'}"]
