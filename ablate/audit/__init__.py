"""``python -m ablate.audit``: is this stand-in reference good enough for my model and my data, before any training?

For a model (any ``model=`` option), one or more regimes (``ref=full,int8,...``) and a dataset (the task's pairs
and prompts, or a JSONL of prompt/chosen/rejected), the fidelity of what each algorithm would consume from each
regime's reference at step 0, against the exact full reference in fp32, side by side
(:mod:`ablate.eval.fidelity`'s figures, the stand-in divergence and the regime's cost). Modules: :mod:`.cli` (the
command line, top to bottom), :mod:`.data` (the JSONL reader), :mod:`.checks` (tokenizer checks), :mod:`.measure`
(one regime's figures), :mod:`.table` (the table and the files).
"""
