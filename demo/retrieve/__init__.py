"""The Retrieve tab.

- `tab`: checkpoint, gallery, query and download controls and their handlers.
- `service`: `RetrievalService`: checkpoints, cached indexes, queries. `galleries`: what can be searched.
- `index_builds`: gallery index builds in flight, with their progress. `tiles`: results as tiles.
- `sketchpad`: a sketch pad whose drawing is checked before decoding. `download`: a checkpoint as a zip.
"""
