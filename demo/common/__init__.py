"""What every part of the page shares.

- `handlers`: what every event handler gets: its context, who is asking, refusals as messages.
- `settings`: `AppSettings` from the environment.
- `allowed_paths`: which server paths a visitor may name.
- `hub_access`: whose Hub token a visitor's request carries (on a Space: theirs or none, never the server's).
- `cores`: cores shared between the web server and the runs' processes.
- `inputs`: numbers typed into the page or sent to its API, checked.
- `uploads`, `upload_store`: checks on uploaded images and zips; the folder of unpacked uploads.
- `shims`: every use of gradio and plotly outside their documented APIs, each checked against the pinned version.
- `starting_page`: the page served while `python app.py` starts, before gradio and torch are imported.
- `shared_plot`: `SharedPlot`, a plot whose figure is written to JSON once for every page that is sent it.
"""
