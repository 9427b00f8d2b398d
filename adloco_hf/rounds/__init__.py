"""A round's end: its rules (`rules.py`), the rows it reads and writes (`rows.py`), the pure decision every rank takes
(`decision.py`), the run's state after it (`state.py`), what it logs (`log_lines.py`), and the running tally a worker
keeps during it (`tally.py`)."""
