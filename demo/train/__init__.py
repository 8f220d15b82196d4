"""The Train tab.

- `tab`: its controls, their handlers and wiring. `views`: the live views beside them. `poll`: what each page was
  last sent and the handlers that keep it current.
- `live_view`: what the tab shows of a run, drawn on one background thread.
- `figures`, `spread_figures`: the curves, the class count, the target cosine, the spread curves, all classes.
- `focus_view`, `focus_figure`: the focus view (a few classes, the paper's Fig. 7) as a page keeps it, and its picture.
- `words`: the tab's words, true to docs/method.md. `presets`: each embedded dataset's settings.
  `results_table`: a run against its baseline, and what the study says to expect.
"""
