"""Built-in demo: a small character-level GPT trained on bundled public-domain text.

Run it with `python -m ptdash.demo.train`; it is a plain PyTorch script and knows
nothing about ptdash.
"""
