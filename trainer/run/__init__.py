"""The run around its steps: the event log and the stop policies (`events`), a step's event metrics
(`metrics`), the fault injection the tests drive from environment variables (`faults`), and the process's
heap setting (`heap`)."""
