"""The Train tab's words: what the picture and the curves show, what N, M and the warm-up do, with values that suit
each embedded dataset. Kept true to docs/method.md (its sections are named where a sentence rests on one).
"""

from __future__ import annotations

from demo.train.presets import PRESETS, arrival_steps

# docs/reproduction.md, section 10: the paper's regime, measured; no preset offers it, as that study's rule decided
HUB_DATASET_INFO = ("An image-classification dataset on the Hub, read with 🤗 datasets: its one Image and one "
                    "ClassLabel column. Its splits are kept if they hold different classes (as SOP's); otherwise they "
                    "are pooled and the first half of the classes trains, the rest tests (as CUB's and CARS's).")
DATASET_INFO = ("The embedded characters in twelve faces (glyphs-mini: a quick look), or your own images: one "
                "sub-folder per class.")
# under Advanced, not under the dataset on the first screen, where it greeted a visitor before anything had trained
REGIME_NOTE = ("The paper's own setting, a pretrained backbone fine-tuned on a hundred "
               "classes, is not offered: fine-tuned that way on all 116 glyph classes, MemVir changed no test "
               "metric measurably. On 12 or 35 of them it led the baseline at the same optimiser by 1.3 to 2.2 "
               "points of MAP@R over ten seeds, and by more when the baseline's loss was halved as the paper's "
               "reduction halves the live batch's; but every run ended below the pretrained backbone it started "
               "from: there MemVir limits the harm of fine-tuning, and stopping early keeps the backbone "
               "(docs/reproduction.md, section 10).")

# docs/method.md, "The idea" and "Algorithm"
MEMVIR_NOTE = ("**MemVir** stores every step's embeddings and class weights. After the warm-up, the step j(M+1) back "
               "returns as *virtual set j*: C more classes, copies that count as classes of their own, which the live "
               "embeddings must be told apart from. One more set arrives every M+1 steps, up to N. Changes apply to a "
               "running run at its next step: release the slider, or type a number and press Enter (leaving the box "
               "sends nothing).")

N_INFO = ("Past steps used as virtual classes, C classes each (0 = the baseline). A larger N makes the task harder. "
          "The presets: 4 on glyphs (the fair comparison's choice), 3 on glyphs-mini; the reference code's CARS196 "
          "commands use 45 with Norm-softmax and 20 with Proxy-NCA, over far longer runs.")
M_INFO = ("Steps between the past steps used: set j is the step j(M+1) back, and each set arrives M+1 steps after "
          "the one before. A smaller M makes the task harder. The presets: 10 on glyphs and on glyphs-mini (the "
          "reference code's: 10 with Norm-softmax, 25 with Proxy-NCA).")
WARMUP_INFO = ("Epochs of plain training first: nothing is stored, and the first virtual set arrives M+1 steps "
               "after it ends. Suggested: 2 on glyphs, 1 on glyphs-mini (the paper: 50, its reference code: 40).")

# docs/method.md, "Reduction"
REDUCTION_CHOICES = [("official: the mean over all rows (the reference code)", "official"),
                     ("balanced: the set means summed, (k+1) x official", "balanced")]
REDUCTION_INFO = ("How the loss averages over the live batch and the virtual sets. Official: with k sets in use the "
                  "live batch has 1/(k+1) of the gradient, which with a large Adam eps acts partly like a lower "
                  "learning rate. Balanced: each set averaged on its own and the means summed; since every set "
                  "has a batch's rows, that is exactly k+1 times the official loss, the same direction with a "
                  "larger step, not a different use of the virtual classes (docs/method.md, \"Reduction\"). "
                  "glyphs' preset uses balanced: in the widened fair comparison, where each reduction and the "
                  "baseline had the same search over the optimiser (the step size included), balanced's choice "
                  "scored the higher validation MAP@R; on the test classes its gain over the tuned baseline is "
                  "matched by a baseline given the same step schedule (docs/reproduction.md, \"A converged "
                  "search\").")
SCALE_INFO = ("The loss's scale s (logits = s cos): the loss's own default, or the tuned one for the preset's loss. "
              "Softmax and Proxy-Anchor take none and ignore it.")

FOCUS_INFO = ("Training-class indices to draw, separated by commas (6 to 10 read best; empty: 8 drawn with the "
              "run's seed). Press Enter to apply them to the running run from its next snapshot; at Start they "
              "apply from the first.")

# docs/method.md, "What the app shows"
SNAPSHOT_HELP = """**What you are seeing.** A few training classes (the caption names them; pick others below), each \
in its own colour, the same in every snapshot. The map, PCA or UMAP, squeezes the embedding space into two \
dimensions, every point of the picture at once: it keeps where the classes lie beside one another and shortens most \
distances.

- **Dots**: the network's embeddings of the class's training images now, drawn over everything else. Click one to \
see its image beside its nearest neighbours in the full embedding space, under the picture.
- **Outlined diamonds**: the class weights now, which the loss compares embeddings with.
- **Pale diamonds and rings**: the class weights and the embeddings stored j(M+1) steps ago, paler the older: the \
*virtual classes*, which count as classes of their own, placed by the map like the rest. Where rings sit apart from \
the dots, the network has moved those images on since.

A stored weight differs from the live one by a few degrees, mostly in directions a map leaves out, so on the map it \
sits close to its live weight. **A few classes, drift** shows how far each has moved: one small panel per class, the \
live weight in the middle and each stored weight at its true angle from it, to one scale in every panel (hover a \
point for the angle and its cosine). Right after a set arrives its weights sit a few degrees from the live ones; as \
training moves the network on, they drift further, older ones mostly further (the curves above give the mean \
cosines). The paper's Fig. 7 shows a model trained far longer, real and virtual classes all told apart. **All \
classes** draws every class at once, where this detail drowns in the crowd."""

# Under the few-class map of a glyphs run: what its preset lets the map show (measured: docs/app.md)
GLYPHS_MAP_NOTE = ("On glyphs at its preset (M = 10) a stored class weight mostly lies 0.5 to 2.5 % of the map's "
                   "width from its live one (3 to 7°), under a diamond's width, and a virtual set holds about one "
                   "image of the classes shown in all, often none: the map shows where the virtual classes sit, not "
                   "clusters of their own as in the paper's Fig. 7; **a few classes, drift** shows how far they moved.")

SPREAD_HELP = """**The drift, as numbers.** Left: for each virtual set in use, the mean cosine between a class's \
stored weight and its weight now (solid; 1 is an exact copy), and between stored embeddings and their class's weight \
now (dotted), beside the live embeddings' own (black). The lower a set's lines, the more its virtual classes differ \
from the real ones. Right: the mean cosine between two real class weights (near 0: spread over the sphere; towards 1: \
crowded) and their uniformity (lower: more evenly spread); **Compare with baseline** adds the same run without \
MemVir, in grey. **With MemVir the real class weights grow more crowded than the baseline's** once the virtual sets \
are in use. This is measured, not explained: the runs we measured show only how it happens, the classes' weights \
moving together in one shared direction, towards where the live embeddings lie on average, where the baseline's \
move each its own way (docs/method.md, "What the app shows")."""

BASELINE_BESIDE = ("Baseline (N = 0) started: it trains beside this run and appears in grey on the curves. The two "
                   "runs share the machine, so each trains at about half its speed until the baseline ends.")
BASELINE_ALONE = ("Baseline (N = 0) started: it trains now, on its own, and appears in grey on the curves; the "
                  "results table follows when it ends.")
BASELINE_STARTING = "Starting the baseline (N = 0): loading its data and model…"


def baseline_optimiser(tuned, trained_before: bool = False) -> str:
    """Which optimiser a baseline trains with (`trained_before`: was trained with, one loaded from its folder), in a
    sentence: the tuned baseline's (a demo.train.presets.Optimiser) or, with none tuned for the run's settings, the
    run's own."""
    trains = "It was trained with" if trained_before else "It trains with"
    if tuned is None:
        return (f"{trains} this run's own optimiser settings: no baseline was tuned for these settings, so the "
                "comparison is against an untuned baseline.")
    return (f"{trains} the baseline's own tuned settings ({tuned.describe()}), chosen with the same search as "
            "MemVir's (docs/reproduction.md, \"A converged search\").")

# Push to Hub (demo.common.hub_access: on a Space a visitor pushes with their own sign-in, never the server's token)
PUSH_UPLOADS = "Uploads config.json, model.safetensors, README.md and metrics.jsonl of the run shown here."
PUSH_AS_YOURSELF = ("Pushes go to the Hub as you, with your sign-in: to a repo under your name or an organisation you "
                    "may write to. " + PUSH_UPLOADS)
SIGN_IN_TO_PUSH = ("Sign in with Hugging Face (the button above) to push: the run goes to your own account, with "
                   "your token. This Space never pushes with its owner's.")
NO_SIGN_IN_ON_THIS_SPACE = ("Push to Hub is off on this Space: it offers no sign-in (its owner can turn it on with "
                            "`hf_oauth: true` in the README's header), and it never pushes with its owner's token.")


# The first screen's three lines: what pressing Start does with the page's opening settings (the glyphs preset,
# demo.train.presets: 12 epochs of 95 steps, the first virtual set at step 202 of 1,140); the times are a laptop CPU's
# (docs/benchmarks.md, "First impressions").
def first_screen(dataset, loss, batch_size, epochs, memvir_n, memvir_m, warmup_epochs) -> str:
    """A one-line summary of the settings below Start, then what happens when Start is pressed: how long, when the
    virtual sets arrive, what to watch."""
    preset = PRESETS["glyphs"]
    steps_per_epoch = 12_252 // preset.batch_size  # glyphs' training images, whole batches
    steps = steps_per_epoch * preset.epochs
    first = arrival_steps(steps_per_epoch, preset.warmup_epochs, preset.memvir_n, preset.memvir_m)[0]
    warmup = f"{_number(warmup_epochs)} warm-up epoch{'' if warmup_epochs == 1 else 's'}"
    memvir = ("the baseline (N = 0)" if memvir_n == 0 else
              f"MemVir N = {_number(memvir_n)}, M = {_number(memvir_m)} after {warmup}")
    return (f"**Settings:** {dataset or 'no dataset'} · {loss} · batch {_number(batch_size)} · "
            f"{_number(epochs)} epochs · {memvir} (all below)\n\n"
            f"**When you press Start:** the default run (glyphs, {steps:,} steps) takes about 5 minutes on a "
            "laptop's CPU; glyphs-mini, a fraction of that.  \n"
            f"The warm-up stores nothing; the first virtual set arrives at step {first} (about 50 s in), then one "
            f"more every {preset.memvir_m + 1} steps up to N.  \n"
            "Watch *classes in use* step up as each set arrives, then Recall@1 on the test classes (and the "
            "baseline's, after Compare with baseline).")


def _number(value) -> str:
    """A setting as the summary shows it: whole numbers without a trailing .0, anything else as typed."""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    return f"{value:,}" if isinstance(value, int | float) else str(value)
