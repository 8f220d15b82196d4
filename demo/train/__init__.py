"""The Train tab.

- `tab`: its controls, their handlers and wiring. `views`: the live views beside them. `poll`: what each page was
  last sent and the handlers that keep it current.
- `live_view`: what the tab shows of a run, drawn on one background thread.
- `figures/`: the tab's plotly figures, pure functions of a run's records and snapshots.
- `neighbours`: a clicked point of the snapshot picture, its image and its nearest neighbours.
- `past_runs`: the runs on this server, listed newest first; the one picked is shown.
- `words`: the tab's words, true to docs/method.md. `presets`: each embedded dataset's settings.
  `results_table`: a run against its baseline, and what the study says to expect.
"""
