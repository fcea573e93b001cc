"""What an update trains on, read from the lake: the stored rows as tensors (:mod:`~ragen_core.update.rows`), one
iteration's kept training rows in the update's order (:mod:`~ragen_core.update.inputs`) and the advantage of each of
their tokens (:mod:`~ragen_core.update.advantages`). Below ``training`` (the engines that step on them), so what reads
them without training (the viewer) reads the same rows and the same advantages. Import from the modules: importing
the package stays light (a worker that pads a batch reads no lake)."""
