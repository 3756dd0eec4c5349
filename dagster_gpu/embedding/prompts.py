"""Which prompt a sentence-transformers model puts in front of each text, by sentence-transformers' own rule.

A model's ``config_sentence_transformers.json`` may carry ``prompts`` (name -> text, e.g. ``{"query":
"query: ", "document": "passage: "}``) and a ``default_prompt_name``; the loaded ``SentenceTransformer``
holds them as ``st.prompts`` / ``st.default_prompt_name``. ``SentenceTransformer.encode`` resolves the prompt
in ``BaseModel._resolve_prompt`` (sentence-transformers 6.2, ``sentence_transformers/base/model.py``):

* an explicit ``prompt`` wins (an empty string included: it switches the default off), and a
  ``prompt_name`` given beside it is ignored;
* else ``prompt_name`` is looked up in ``st.prompts`` (unknown name: ValueError listing the keys);
* else the model's ``default_prompt_name``, when set, names the prompt;
* else no prompt.

The text is then prepended to every input (``Transformer.preprocess`` -> ``prepend_prompt_to_texts``,
``sentence_transformers/base/modality.py``), which ``encoder.Encoder(prompt=...)`` does the same way.
"""

from __future__ import annotations


def resolve_prompt(st, prompt_name: str | None = None, prompt: str | None = None) -> tuple[str, str | None]:
    """``(prompt text, prompt name or None)`` that ``st.encode(prompt_name=..., prompt=...)`` would apply.

    The text is ``""`` when no prompt applies. The name is the one the text came from (``prompt_name``
    or the model's default), None for an explicit ``prompt`` or no prompt.

    Raises ValueError naming the model's prompt names when ``prompt_name`` (or the model's own
    ``default_prompt_name``) is not one of them.
    """
    prompts: dict = dict(getattr(st, "prompts", None) or {})
    if prompt is not None:
        return str(prompt), None
    name = prompt_name if prompt_name is not None else getattr(st, "default_prompt_name", None)
    if name is None:
        return "", None
    if name not in prompts:
        which = "prompt_name" if prompt_name is not None else "the model's default_prompt_name"
        raise ValueError(f"{which} {name!r} is not one of the model's prompts {sorted(prompts)!r} "
                         f"(config_sentence_transformers.json 'prompts')")
    return str(prompts[name] or ""), name


def query_prompt(st) -> str:
    """The model's ``"query"`` prompt text (what ``SentenceTransformer.encode_query`` applies), else ``""``."""
    prompts: dict = dict(getattr(st, "prompts", None) or {})
    return str(prompts.get("query") or "")
