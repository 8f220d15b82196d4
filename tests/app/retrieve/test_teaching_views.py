"""The Retrieve tab's views of what a checkpoint gets wrong (side by side, hardest queries, per class), through the
service and the handlers, against brute-force references written here: the glyphs-mini test split embedded by the
dataset's own test transform, every query's whole gallery sorted in numpy by (similarity, index). Nothing is timed."""

import csv
import html
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sign_vectors import clustered_sign_vectors

from demo.common.settings import AppSettings
from demo.retrieve import tab
from demo.retrieve.service import RetrievalError, RetrievalService
from demo.retrieve.tiles import Tile, caption
from memvir.data import load_dataset
from memvir.models.embedding_model import EmbeddingModel
from memvir.retrieval import prepare_query
from memvir.retrieval.metrics import retrieval_metrics


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """A service over two untrained glyphs-mini checkpoints, "memvir" (its card says MemVir) and "baseline", each
    with its test split's gallery index shipped beside it (memvir.retrieval.shipped_gallery) holding
    `clustered_sign_vectors` in place of the model's embeddings (an untrained model's are within an ulp of one
    another, and the order of such near-ties is the float arithmetic's, not the ranking's)."""
    from memvir.retrieval import shipped_gallery

    root = tmp_path_factory.mktemp("teaching-views")
    split = load_dataset("glyphs-mini").test
    folders = {}
    for seed, name in ((0, "memvir"), (1, "baseline")):
        torch.manual_seed(seed)
        folder = root / "checkpoints" / name
        model = EmbeddingModel(embedding_dim=16, in_channels=1, image_size=32, mean=(0.096,), std=(0.272,),
                               dataset="glyphs-mini")
        model.save_pretrained(folder)
        shipped_gallery.build(folder, split, "glyphs-mini", model=model)
        np.save(folder / "gallery" / "vectors.npy", clustered_sign_vectors(np.asarray(split.labels), seed))
        folders[name] = str(folder)
    card = Path(folders["memvir"]) / "README.md"
    card.write_text(card.read_text(encoding="utf-8") + "\n| MemVir | N=5, M=100 |\n", encoding="utf-8")
    service = RetrievalService(AppSettings(data_dir=root / "data", checkpoints_dir=root / "checkpoints", umap=False))
    return service, folders


def reference_embeddings(service, choice):
    """The gallery vectors the checkpoint's shipped index holds, in float64, and the test split's labels."""
    vectors = np.load(Path(choice) / "gallery" / "vectors.npy").astype(np.float64)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), np.asarray(load_dataset("glyphs-mini").test.labels)


def reference_figures(vectors, labels, query, query_label, exclude=None):
    """(AP@R, first correct rank, R) of one query from its whole ranking."""
    similarity = vectors @ (query / np.linalg.norm(query))
    order = np.lexsort((np.arange(len(labels)), -similarity))
    order = order[order != exclude] if exclude is not None else order
    correct = labels[order] == query_label
    same = int(correct.sum())
    ranks = np.arange(1, same + 1)
    average_precision = float((np.cumsum(correct[:same]) / ranks * correct[:same]).sum() / same)
    return average_precision, int(np.argmax(correct)) + 1, same


def reference_all(vectors, labels):
    return np.array([reference_figures(vectors, labels, vectors[i], labels[i], exclude=i) for i in range(len(labels))])


def test_the_comparison_starts_on_the_bundled_baseline(two):
    service, folders = two
    assert service.default_checkpoint() == folders["memvir"]
    assert service.comparison_checkpoint() == folders["baseline"]
    assert service.comparison_checkpoint(folders["baseline"]) == folders["memvir"]


def test_rankings_are_each_items_brute_force_figures_and_computed_once(two):
    service, folders = two
    checkpoint = service.load_checkpoint(folders["memvir"])
    gallery = service.test_split_gallery(checkpoint)
    rankings = service.rankings(checkpoint, gallery)
    vectors, labels = reference_embeddings(service, folders["memvir"])
    expected = reference_all(vectors, labels)
    np.testing.assert_allclose(rankings.average_precision, expected[:, 0], atol=1e-9)
    np.testing.assert_array_equal(rankings.first_correct_rank, expected[:, 1])
    assert service.rankings(checkpoint, gallery) is rankings  # kept: a second view costs no search


def test_an_unlabelled_gallery_cannot_be_ranked(two, tmp_path):
    service, folders = two
    checkpoint = service.load_checkpoint(folders["memvir"])
    paths = []
    for index in range(3):
        paths.append(tmp_path / f"{index}.png")
        load_dataset("glyphs-mini").test.image(index).save(paths[-1])
    with pytest.raises(RetrievalError, match="this gallery has no classes"):
        service.rankings(checkpoint, service.uploaded_gallery(paths))


def _shown_figures(summary):
    return {name: (float(ap), int(rank)) for name, ap, rank in
            re.findall(r"`([^`]+)`: AP@R ([0-9.]+) · first correct #(\d+)", summary)}


def test_side_by_side_shows_each_checkpoints_figures_for_an_uploaded_query(two, tmp_path):
    service, folders = two
    split = load_dataset("glyphs-mini").test
    query_path = tmp_path / "query.png"
    split.image(40).save(query_path)
    class_name = split.class_names[split.labels[40]]
    handlers = tab.RetrieveHandlers(service)
    summary, columns, shown = handlers.compare_upload(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, 6,
                                                      class_name.split(" ")[0], str(query_path))
    figures = _shown_figures(summary)
    assert set(figures) == {"memvir", "baseline"}
    for name in ("memvir", "baseline"):
        checkpoint = service.load_checkpoint(folders[name])
        query = checkpoint.model.embed(prepare_query(split.image(40), checkpoint.config))[0].numpy()
        vectors, labels = reference_embeddings(service, folders[name])
        average_precision, first_correct, same = reference_figures(vectors, labels, query.astype(np.float64),
                                                                   int(split.labels[40]))
        assert figures[name] == (round(average_precision, 3), first_correct)
    assert columns.count('class="side-column"') == 2
    assert columns.count('class="result-tile same"') + columns.count('class="result-tile other"') == 12
    assert shown is not None


def test_side_by_side_honours_the_similarity_cut_off(two, tmp_path):
    """Each column's hits below the cut-off are dimmed at their ranks: those whose brute-force cosine to the query is
    below it (the cut-off set between two of a column's cosines, away from the others)."""
    service, folders = two
    split = load_dataset("glyphs-mini").test
    query_path = tmp_path / "query.png"
    split.image(40).save(query_path)
    class_name = split.class_names[split.labels[40]].split(" ")[0]
    checkpoint = service.load_checkpoint(folders["memvir"])
    query = checkpoint.model.embed(prepare_query(split.image(40), checkpoint.config))[0].numpy()
    vectors, _ = reference_embeddings(service, folders["memvir"])
    scores = np.sort(vectors @ (query.astype(np.float64) / np.linalg.norm(query)))[::-1]
    cut = float((scores[2] + scores[3]) / 2)
    handlers = tab.RetrieveHandlers(service)
    summary, columns, _ = handlers.compare_upload(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, 6,
                                                  class_name, str(query_path), cutoff=str(cut))
    first_column = columns.split('class="side-column"')[1]
    marks = [alt.endswith("below the cut-off") for alt in re.findall(r'alt="([^"]*)"', first_column)[:6]]
    assert marks == [False] * 3 + [True] * 3
    assert f"3 of 6 below the cut-off {cut:.4f}, dimmed" in summary  # the first checkpoint's line
    assert summary.count("below the cut-off") == 2  # and the second's


@pytest.mark.parametrize(("second", "message"), [("", "choose a second checkpoint"),
                                                 (None, "the two checkpoints are the same")])
def test_side_by_side_refuses_a_missing_or_repeated_checkpoint(two, tmp_path, second, message):
    service, folders = two
    query_path = tmp_path / "query.png"
    load_dataset("glyphs-mini").test.image(3).save(query_path)
    handlers = tab.RetrieveHandlers(service)
    summary, columns, _ = handlers.compare_upload(folders["memvir"], folders["memvir"] if second is None else second,
                                                  tab.TEST_SPLIT, 4, "", str(query_path))
    assert message in summary and columns == ""


def test_the_hardest_queries_are_the_brute_force_worst(two):
    service, folders = two
    handlers = tab.RetrieveHandlers(service)
    summary, rows = handlers.show_hardest(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, "map@r")
    vectors, labels = reference_embeddings(service, folders["memvir"])
    expected = reference_all(vectors, labels)
    worst = sorted(range(len(labels)), key=lambda i: (expected[i, 0], -expected[i, 1], i))[:8]
    shown = [int(item) for item in re.findall(r'class="result-tile hard-query" data-item="(\d+)"', rows)]
    assert shown == worst
    first = re.search(r'class="hard-figures">AP@R ([0-9.]+) · first correct #(\d+)<', rows)
    assert (float(first.group(1)), int(first.group(2))) == (round(expected[worst[0], 0], 3), expected[worst[0], 1])
    assert "The 8 hardest" in summary and rows.count('class="result-tile missed"') > 0


def test_where_two_checkpoints_differ_both_ways(two):
    service, folders = two
    handlers = tab.RetrieveHandlers(service)
    summary, rows = handlers.show_hardest(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, "map@r", True)
    first = reference_all(*reference_embeddings(service, folders["memvir"]))[:, 0]
    second = reference_all(*reference_embeddings(service, folders["baseline"]))[:, 0]
    difference = first - second
    first_better = sorted(np.flatnonzero(difference > 1e-9), key=lambda i: (-difference[i], i))[:8]
    sections = rows.split('<section class="hard-section">')[1:]
    assert len(sections) == 2 and "memvir finds more than baseline" in html.unescape(sections[0])
    shown = [int(item) for item in re.findall(r'data-item="(\d+)"', sections[0])]
    assert shown == first_better


def test_the_per_class_table_against_grouped_brute_force_and_its_csv(two):
    service, folders = two
    handlers = tab.RetrieveHandlers(service)
    summary, frame, confused, csv_path = handlers.show_per_class(folders["memvir"], folders["baseline"],
                                                                 tab.TEST_SPLIT, True)
    split = load_dataset("glyphs-mini").test
    for letter, name in (("A", "memvir"), ("B", "baseline")):
        vectors, labels = reference_embeddings(service, folders[name])
        expected = reference_all(vectors, labels)
        for code, class_name in enumerate(split.class_names):
            row = frame[frame["class"] == class_name].iloc[0]
            members = labels == code
            assert row["MAP@R " + letter] == pytest.approx(expected[members, 0].mean(), abs=6e-5)
            assert row["Recall@1 " + letter] == pytest.approx((expected[members, 1] == 1).mean(), abs=6e-5)
        weighted = (frame["MAP@R " + letter] * frame["queries"]).sum() / frame["queries"].sum()
        # The torch search settles every tie by lower index; faiss may keep another of the items tied at the last
        # place it returns (memvir.retrieval.knn), which these exact ties reach.
        assert weighted == pytest.approx(retrieval_metrics(vectors, labels, backend="torch")["map@r"], abs=1e-4)
    # A minus B in percentage points, as the Train tab gives MemVir minus its baseline
    np.testing.assert_allclose(frame["Δ MAP@R (A − B, points)"], 100 * (frame["MAP@R A"] - frame["MAP@R B"]),
                               atol=2e-2)
    assert "Δ is A minus B in percentage points" in summary
    assert frame["MAP@R A"].is_monotonic_increasing  # the worst classes first
    assert "A = `memvir`" in summary and "B = `baseline`" in summary
    with open(csv_path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == len(split.class_names) and rows[0]["class"] == frame["class"].iloc[0]
    assert float(rows[0]["MAP@R memvir"]) == frame["MAP@R A"].iloc[0]  # the file names the checkpoints
    assert set(confused["checkpoint"]) == {"A", "B"} and (confused["confusions"] > 0).all()
    assert "Over all queries" in summary


def test_a_missed_tile_says_so_in_its_caption():
    from PIL import Image

    tile = Tile(Image.new("L", (4, 4)), 37, 0.5, "A U+0041", True, missed=True)
    assert caption(tile) == "#37 0.500 A U+0041 missed"


def test_side_by_side_without_the_query_class_marks_nothing_and_says_what_to_name(two, tmp_path):
    service, folders = two
    query_path = tmp_path / "query.png"
    load_dataset("glyphs-mini").test.image(7).save(query_path)
    handlers = tab.RetrieveHandlers(service)
    summary, columns, _ = handlers.compare_upload(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, 5, "",
                                                  str(query_path))
    assert "Name the query's class" in summary and "AP@R" not in columns
    assert columns.count('class="result-tile"') == 10  # five a checkpoint, unmarked


def test_an_order_the_hardest_view_does_not_know_is_refused(two):
    service, folders = two
    handlers = tab.RetrieveHandlers(service)
    summary, rows = handlers.show_hardest(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, "recall")
    assert "order the hardest queries by lowest AP@R or by latest first correct" in summary and rows == ""


def test_a_clicked_gallery_item_is_ranked_without_itself(two):
    service, folders = two
    checkpoint = service.load_checkpoint(folders["baseline"])
    gallery = service.test_split_gallery(checkpoint)
    item = 100
    ranking, _ = service.query_ranking(checkpoint, gallery, gallery.image(item), 5, gallery.class_of(item),
                                       exclude=item)
    query = checkpoint.model.embed(prepare_query(gallery.image(item), checkpoint.config))[0].numpy()
    vectors, labels = reference_embeddings(service, folders["baseline"])
    expected = reference_figures(vectors, labels, query.astype(np.float64), labels[item], exclude=item)
    row = ranking.row(0)
    assert item not in row["neighbours"] + row["missed"]
    assert (row["average_precision"], row["first_correct_rank"], row["same_class"]) == pytest.approx(expected)
    with pytest.raises(RetrievalError, match="has no class 'no such class'"):
        service.query_ranking(checkpoint, gallery, gallery.image(item), 5, "no such class")


@pytest.mark.parametrize(("call", "message"), [
    (lambda handlers, folders: handlers.show_per_class(folders["memvir"], "\ud800", tab.TEST_SPLIT, True),
     "the second checkpoint holds a broken character"),
    (lambda handlers, folders: handlers.show_hardest(folders["memvir"], "x" * 2000, tab.TEST_SPLIT, "map@r", True),
     "the second checkpoint is 2,000 characters long"),
    (lambda handlers, folders: handlers.show_per_class(folders["memvir"], "/etc", tab.TEST_SPLIT, True),
     "neither an existing folder nor a Hub repo id this app may load"),
])
def test_hostile_second_checkpoints_are_refused_in_words(two, call, message):
    service, folders = two
    answer = call(tab.RetrieveHandlers(service), folders)
    assert answer[0].startswith("⚠️") and message in answer[0] and "/etc" not in answer[0], answer[0]
    assert all(value is None or value == "" for value in answer[1:])


def test_a_clicked_sample_image_side_by_side_is_ranked_without_itself(two):
    service, folders = two
    handlers = tab.RetrieveHandlers(service)
    _, _, picked = handlers.prepare(folders["memvir"], tab.TEST_SPLIT)
    position = 3
    item = picked["sample"][position]
    summary, columns, _ = handlers.compare_gallery_item(folders["memvir"], folders["baseline"], tab.TEST_SPLIT,
                                                        4, picked, position)
    figures = _shown_figures(summary)
    for name in ("memvir", "baseline"):
        checkpoint = service.load_checkpoint(folders[name])
        gallery = service.test_split_gallery(checkpoint)
        query = checkpoint.model.embed(prepare_query(gallery.image(item), checkpoint.config))[0]
        vectors, labels = reference_embeddings(service, folders[name])
        average_precision, first_correct, same = reference_figures(vectors, labels, query.numpy().astype(np.float64),
                                                                   labels[item], exclude=item)
        assert figures[name] == (round(average_precision, 3), first_correct)
        assert f"{same} of its class in the gallery" in summary
    unclicked = handlers.compare_gallery_item(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, 4, picked,
                                              None)
    assert "click an image of the Pick tab first" in unclicked[0]


def test_remembering_a_click_names_a_shown_image_or_nothing():
    picked = {"sample": [5, 9, 12], "gallery": "g"}

    class Event:
        def __init__(self, index):
            self.index = index

    assert tab.remember_pick(picked, Event(2)) == 2
    assert tab.remember_pick(picked, Event(3)) is None
    assert tab.remember_pick(picked, Event("1")) is None
    assert tab.remember_pick(None, Event(0)) is None


def test_an_uploaded_zip_of_class_folders_gets_the_views_too(two, tmp_path):
    """A labelled upload is ranked like a test split: its per-class table has its folders, and the queries' mean is
    the metrics' on the embeddings the service indexed. The metrics search in torch: an untrained model's
    embeddings lie so close that some similarities tie exactly, and faiss may keep another of the items tied at the
    last place it returns (memvir.retrieval.knn), where the rankings settle every tie by lower index."""
    import zipfile

    service, folders = two
    split = load_dataset("glyphs-mini").test
    archive = tmp_path / "classes.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for item in range(0, 60, 2):
            image_path = tmp_path / f"{item}.png"
            split.image(item).save(image_path)
            handle.write(image_path, f"folder {item % 3}/{item}.png")
    handlers = tab.RetrieveHandlers(service)
    summary, frame, confused, _ = handlers.show_per_class(folders["memvir"], folders["baseline"], tab.UPLOADED,
                                                          False, [str(archive)])
    assert sorted(frame["class"]) == ["folder 0", "folder 1", "folder 2"] and frame["queries"].tolist() == [10] * 3
    checkpoint = service.load_checkpoint(folders["memvir"])
    gallery = service.uploaded_gallery([str(archive)])
    vectors = service.index(checkpoint, gallery).index.vectors()
    expected = retrieval_metrics(vectors, np.asarray(gallery.labels), backend="torch")
    ranked = service.rankings(checkpoint, gallery)
    assert ranked.average_precision.mean() == pytest.approx(expected["map@r"], abs=1e-12)
    _, rows = handlers.show_hardest(folders["memvir"], folders["baseline"], tab.UPLOADED, "map@r", False,
                                    [str(archive)])
    assert rows.count('class="hard-row"') == 8


def test_warming_up_ranks_the_default_pair_so_the_views_rank_nothing(two, monkeypatch):
    import memvir.retrieval.diagnosis.ranking

    _, folders = two
    ranked = []
    real = memvir.retrieval.diagnosis.ranking.rank_gallery
    monkeypatch.setattr(memvir.retrieval.diagnosis.ranking, "rank_gallery",
                        lambda *args, **kwargs: ranked.append(args[0].shape) or real(*args, **kwargs))
    checkpoints = Path(folders["memvir"]).parent
    service = RetrievalService(AppSettings(data_dir=checkpoints.parent / "fresh-data", checkpoints_dir=checkpoints,
                                           umap=False))
    service.warm_up().join(120)
    assert ranked == [(288, 16), (288, 16)]  # the MemVir checkpoint and its baseline
    handlers = tab.RetrieveHandlers(service)
    handlers.show_hardest(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, "map@r", True)
    handlers.show_per_class(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, True)
    assert len(ranked) == 2


def _tile_clicks(tiles: str) -> list[str]:
    """What the page's script sends for each clickable tile: {"gallery": ..., "item": ...} as JSON."""
    import json

    return [json.dumps({"gallery": html.unescape(gallery), "item": int(item)})
            for gallery, item in re.findall(r'data-gallery="([^"]*)" data-item="(\d+)"', tiles)]


def test_a_clicked_result_searches_with_that_gallery_image_without_itself(two):
    """A result tile's click ranks the whole gallery against that image, itself left out: the tiles are the brute
    force's order of the gallery's vectors, with their classes and cosines."""
    service, folders = two
    choice = folders["baseline"]
    item = 100
    checkpoint = service.load_checkpoint(choice)
    gallery = service.test_split_gallery(checkpoint)
    handlers = tab.RetrieveHandlers(service)
    _, first_tiles, _ = handlers.search_result_tile(choice, tab.TEST_SPLIT, 5, _tile_clicks(
        tab.tiles_html([Tile(gallery.image(item), 1, 1.0, None, None, clickable=(gallery.key, item))]))[0])
    query = checkpoint.model.embed(prepare_query(gallery.image(item), checkpoint.config))[0].numpy()
    vectors, labels = reference_embeddings(service, choice)
    similarity = vectors @ (query.astype(np.float64) / np.linalg.norm(query))
    order = [i for i in np.lexsort((np.arange(len(labels)), -similarity)) if i != item][:5]
    names = load_dataset("glyphs-mini").test.class_names
    expected = [f"#{rank} {similarity[i]:.3f} {names[labels[i]]} "
                f"{'same' if labels[i] == labels[item] else 'other'} class" for rank, i in enumerate(order, 1)]
    assert [html.unescape(text) for text in re.findall(r'<img [^>]*alt="([^"]*)"', first_tiles)] == expected
    # its tiles are clickable in turn, each naming its own item
    assert [int(re.search(r'"item": (\d+)', click).group(1)) for click in _tile_clicks(first_tiles)] == order


@pytest.mark.parametrize(("picked", "message"), [
    ("nonsense", "click one of the results to search with it"),
    ('{"gallery": "upload:elsewhere", "item": 3}', "those results came from another gallery than the one chosen"),
    ("{gallery}", "click one of the results"),
    ('{"gallery": "GALLERY", "item": 1e9}', "the result clicked is not an image of the glyphs-mini test split"),
    ('{"gallery": "GALLERY", "item": -1}', "the result clicked is not an image of"),
])
def test_a_click_that_names_no_result_of_the_gallery_chosen_is_refused_in_words(two, picked, message):
    service, folders = two
    gallery = service.test_split_gallery(service.load_checkpoint(folders["baseline"]))
    handlers = tab.RetrieveHandlers(service)
    with pytest.warns(UserWarning):
        about, tiles, _ = handlers.search_result_tile(folders["baseline"], tab.TEST_SPLIT, 5,
                                                      picked.replace("GALLERY", gallery.key))
    assert about.startswith("⚠️ ") and message in about and tiles == ""


def test_the_hardest_view_dims_the_hits_below_the_cut_off_as_the_search_does(two):
    """The worst query's top k by brute force, with a cut-off where its similarity first drops: the tiles above it
    stay, the others are dimmed and marked, and the summary says so."""
    service, folders = two
    vectors, labels = reference_embeddings(service, folders["memvir"])
    expected = reference_all(vectors, labels)
    worst = sorted(range(len(labels)), key=lambda i: (expected[i, 0], -expected[i, 1], i))[0]
    similarity = vectors @ vectors[worst]
    order = [i for i in np.lexsort((np.arange(len(labels)), -similarity)) if i != worst][:tab.RANKED_K]
    # the first place where the similarity drops (the sign vectors tie in steps): the cut-off goes there
    kept = next(j for j in range(1, len(order)) if similarity[order[j - 1]] > similarity[order[j]])
    cut = (similarity[order[kept - 1]] + similarity[order[kept]]) / 2
    handlers = tab.RetrieveHandlers(service)
    summary, rows = handlers.show_hardest(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, "map@r",
                                          cutoff=f"{cut:.6f}")
    first_row = rows.split('<div class="hard-row">')[1]
    shown = first_row.split('<div class="hard-tiles">')[1].split("</div>")[0]
    dimmed = ["below-cutoff" in tile for tile in shown.split("<figure")[1:]]
    assert dimmed == [False] * kept + [True] * (tab.RANKED_K - kept)
    assert f"those below the cut-off {float(f'{cut:.6f}'):.4f} dimmed" in summary
    _, plain = handlers.show_hardest(folders["memvir"], folders["baseline"], tab.TEST_SPLIT, "map@r")
    assert "below-cutoff" not in plain
