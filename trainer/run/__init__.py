"""The run around its steps: the event log and the stop policies (`events`), the fault injection the tests
drive from environment variables (`faults`), and the process's heap setting (`heap`)."""
