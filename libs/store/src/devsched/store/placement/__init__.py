"""Placement: which queued task goes on which free device, and the one statement that pairs them.

Where assignment looks is `candidates` (the free devices, and the head of the queue they match, in SQL);
what a pair writes is `pairing.apply`, the one statement that moves the task to `assigned` (or straight to
`dispatched`, for a report's `take_next`) with its new attempt, lease and reservation and inserts its
events. Every path that assigns runs it, each choosing its pairs its own way:

- `assignment`: the loop's pass, over every free device, planned in Python (`devsched.core.matching`);
- `handover`: the device a report frees, to the first queued task it matches, in the report's transaction;
- `submitted`: a submitted task, onto one of the free devices it could use, right after its submit;
- `devsched.store.healthchecks`: a due health check's task, onto its idle device.
"""
