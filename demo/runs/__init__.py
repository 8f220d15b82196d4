"""Training runs as processes of their own, as the server sees them.

- `manager`: `RunManager`, the app's runs, shared by every visitor, and what each page last chose to show
  (`PageChoices`).
- `live_run`: `LiveRun`, one run as the page sees it, built from the Trainer's events. `few_class_track`: its few-class
  view (a few classes, the paper's Fig. 7), `FewClassTrack`. `live_changes`: its live changes in the page's words.
- `process`: `RunProcess`, a run's Trainer in its own process. `child`: inside that process.
- `messages`: what the server and a run's process say to each other. `snapshot_transport`: snapshots as small files.
- `memory_budget`: what MemVir's memory may take in a run's process, measured there.
- `persist`: resting runs copied to a persistent folder (a Space's bucket) and restored from it after a restart;
  `RunKeeper`, the manager's side of it.
- `audience`: the pages watching each run, and how often each should poll.
"""
