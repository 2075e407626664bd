"""Training windows: random stream slices and windows that start at a document's <eos>."""

import numpy as np

from hyla.training.corpus import doc_start_windows, sample_windows

EOS = 0


def _stream() -> tuple[np.ndarray, list]:
    """Three documents <eos> + body, concatenated, and their [name, start, size, bytes] rows."""
    sizes = [50, 30, 70]
    tokens, docs, start = [], [], 0
    for i, size in enumerate(sizes):
        tokens += [EOS] + [100 * (i + 1) + j for j in range(1, size)]
        docs.append([f"m{i}", start, size, 4 * size])
        start += size
    return np.asarray(tokens, dtype=np.uint16), docs


def test_doc_start_windows_begin_at_a_document():
    tokens, docs = _stream()
    rng = np.random.default_rng(0)
    rows = doc_start_windows(tokens, docs, 20, 25, rng)
    assert rows.shape == (20, 25) and rows.dtype == np.int64
    slices = {tuple(tokens[d[1] : d[1] + 25].tolist()) for d in docs}  # no start needs clamping
    for row in rows:
        assert row[0] == EOS and tuple(row.tolist()) in slices
    assert doc_start_windows(tokens, docs, 0, 25, rng).shape == (0, 25)


def test_sample_windows_are_stream_slices():
    tokens, _ = _stream()
    rows = sample_windows(tokens, 8, 10, np.random.default_rng(1))
    for row in rows:
        start = int(np.flatnonzero(tokens == row[1])[0]) - 1
        assert (row == tokens[start : start + 10]).all()
