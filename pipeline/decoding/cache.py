"""One model's side of the loop: its KV cache, which cache positions hold real tokens per row, and its forward.

Both models keep one KV cache whose length is common to all rows, plus a per-row mask of which cache positions
hold real tokens (:class:`CachedModel`): a static cache with the engine's own forward where the model's family has
one (pipeline/decoding/static/), else a transformers ``DynamicCache``. Rows accept different numbers of tokens: the
cache is cropped to the longest accepted prefix and the positions a row rejected stay in the cache as masked
holes, with explicit ``position_ids`` counting only real tokens. At B = 1 there are never holes. Rows that finish
are dropped (:meth:`CachedModel.select`), so they stop costing work.

The forwards add no host sync: with holes the model gets a ready 4-D attention mask (transformers would otherwise
read the 2-D mask back to decide whether it can skip masking: one sync per forward), and GPT-2-style models'
"is there padding without a mask?" warning check (another per-forward read) is switched off during the call.
"""

from __future__ import annotations

import inspect

import torch

from pipeline.decoding.static import static_forward_for
from pipeline.errors import SpecsweepError
from pipeline.tree_tensors import TreeSpan

# How each kind of model is called: (token ids, attention mask, position ids) keyword names.
_CALL_NAMES = {
    "causal": ("input_ids", "attention_mask", "position_ids"),
    "seq2seq": ("decoder_input_ids", "decoder_attention_mask", "decoder_position_ids"),  # e.g. Whisper
    "decoder_with_encoder": ("input_ids", "attention_mask", "position_ids"),  # e.g. WhisperForCausalLM
}


def model_kind(model, target_is_seq2seq: bool = False) -> str:
    """'seq2seq' (an encoder-decoder: its decoder is driven), 'decoder_with_encoder' (a decoder-only draft that
    reads the target's encoder outputs, as distil-large-v2 is used as Whisper's assistant) or 'causal'."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "seq2seq"
    return "decoder_with_encoder" if target_is_seq2seq else "causal"


def attention_mask_4d(mask: torch.Tensor, q: int, fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """The attention mask for the last ``q`` of ``L`` cache positions, in the form transformers passes on as is.

    mask: bool [B, L], True where a position holds a real token. Query i (cache position L - q + i) may attend
    to real positions j <= L - q + i, and always to itself, so a padding query never has an empty row (an
    all-masked row makes sdpa return NaN, which masked keys would then carry into real rows as 0 * NaN).
    Returns bool [B, 1, q, L] (True = attend; fmt "bool", for sdpa) or ``dtype`` [B, 1, q, L] with 0 and the
    dtype's minimum (fmt "float", for eager attention).
    """
    L = mask.shape[1]
    key = torch.arange(L, device=mask.device)
    query = torch.arange(L - q, L, device=mask.device)[:, None]                 # [q, 1]
    allowed = ((key <= query) & mask[:, None, :]) | (key == query)             # [B, q, L]
    allowed = allowed[:, None]
    if fmt == "bool":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill_(~allowed,
                                                                                   torch.finfo(dtype).min)


def _no_padding_warning(*args, **kwargs) -> None:
    """Stands in for transformers' padding-without-mask warning, which reads two ids per forward back to the
    host; the engine passes a mask whenever a row has padding or holes."""


class CachedModel:
    """A causal LM (or the decoder of an encoder-decoder), its KV cache, and which cache positions hold real
    tokens for each row.

    static    the static-cache forward (pipeline/decoding/static/) when ``static`` is asked for and the model's
              family has one (a Whisper decoder's holds its cross-attention keys and values too), with its weights
              quantised as ``quant`` says (pipeline/decoding/static/quant.py; "none": the model's own), or
              with ``packed`` multiplying packed copies of them where it can (pipeline/decoding/static/packed.py), its
              decoding steps compiled as ``compile`` says (pipeline/decoding/static/compiled.py; "off": eager); None:
              transformers' forward with a DynamicCache (an EncoderDecoderCache for a decoder)

    length    int                host: cache positions (common to all rows)
    mask      bool  [B, length]  True where cache position l of row b holds a real token; None while every
                                 position of every row does (always at B = 1), so the common case costs no mask
                                 bookkeeping and the model takes its fast, mask-free causal path
    n_real    int64 [B]          real tokens per row (the next token's position id); kept while mask is kept
    encoder   (hidden [B, S, D],) encoder outputs the decoder attends to (kinds seq2seq, decoder_with_encoder)
    """

    def __init__(self, model, kind: str = "causal", static: bool = False, quant: str = "none",
                 packed: bool = False, compile: str = "off") -> None:
        self.model = model
        self.kind = kind
        self.static = static_forward_for(model, quant, packed, compile) if static else None
        if compile != "off" and self.static is None:
            raise SpecsweepError(f"--compile compiles the engine's static-cache forward, which this model "
                                 f"({type(model).__name__}) does not run: drop --compile or --no-static-cache")
        if quant != "none" and self.static is None:
            raise SpecsweepError(f"--draft-quant {quant} quantises the engine's static-cache forward, which this draft "
                                 f"({type(model).__name__}) does not run: drop --draft-quant or --no-static-cache")
        self._ids, self._mask, self._pos = _CALL_NAMES[kind]
        config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") \
            else model.config
        attn = getattr(config, "_attn_implementation", None) or getattr(model.config, "_attn_implementation", None)
        # the mask format the attention reads: bool (sdpa), additive float (eager), or 2-D (flash/flex, and
        # any model whose layers are not all plain causal, e.g. sliding-window or chunked attention: HF builds
        # each layer's mask from the 2-D mask, at the price of its per-forward read of the mask)
        plain_causal = (getattr(config, "sliding_window", None) is None
                        and getattr(config, "attention_chunk_size", None) is None
                        and set(getattr(config, "layer_types", None) or ()) <= {"full_attention"})
        self._mask_format = {"sdpa": "bool", "eager": "float"}.get(attn, "2d") if plain_causal else "2d"
        self._plain_causal = plain_causal
        self._dtype = next(model.parameters()).dtype
        # modules whose forward reads input ids back to warn about padding without a mask (GPT-2 and kin)
        self._padding_warners = [m for m in model.modules()
                                 if hasattr(m, "warn_if_padding_and_no_attention_mask")
                                 and getattr(m.config, "pad_token_id", None) is not None]
        params = inspect.signature(model.forward).parameters
        self._keeps_logits = "logits_to_keep" in params
        self.encoder: tuple[torch.Tensor] | None = None
        self.cache = None
        self.length = 0
        self.batch = 0
        self.mask: torch.Tensor | None = None
        self.n_real: torch.Tensor | None = None

    def reset(self, batch: int, device: torch.device, encoder_hidden: torch.Tensor | None = None,
              capacity: int = 0) -> None:
        """An empty cache for ``batch`` rows; ``capacity``: the positions a static cache allocates up front."""
        from transformers import DynamicCache, EncoderDecoderCache

        if self.static is not None:
            self.static.allocate(batch, max(capacity, 16), device)
            if self.kind != "causal":                   # a decoder: its cross-attention keys and values, once
                self.static.set_encoder(encoder_hidden)
            self.cache = None
        elif self.kind != "causal":
            self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            self.encoder = (encoder_hidden,)
        elif self._plain_causal:
            self.cache = DynamicCache(config=self.model.config)
        else:
            # Sliding-window (or chunked) layers get a full-length cache: a window-sized cache layer drops the
            # states a rollback needs (transformers refuses such a crop, and its past-recording mode returns
            # mis-sized states over several forwards without a crop in some 5.x releases). The masks HF builds
            # from the 2-D mask still apply each layer's window; the cost is memory for the whole sequence.
            self.cache = DynamicCache()
        self.length, self.batch = 0, batch
        self.mask = self.n_real = None

    @property
    def has_holes(self) -> bool:
        return self.mask is not None

    def _track_holes(self, device: torch.device) -> None:
        """Start the per-row mask: every position so far is real."""
        if self.mask is None:
            self.mask = torch.ones(self.batch, self.length, dtype=torch.bool, device=device)
            self.n_real = torch.full((self.batch,), self.length, dtype=torch.int64, device=device)

    def forward(self, input_ids: torch.Tensor, valid: torch.Tensor | None = None, last: int = 0,
                holes: bool = False, span: TreeSpan | None = None) -> torch.Tensor:
        """Append input_ids [B, k] and return logits [B, k, V] (or only the last ``last`` positions, [B, last, V]).

        valid  bool [B, k] or None (all real): False marks a hole (padding, or a slot a row does not use). The
               caller says whether it holds any False (``holes``): the host knows without a sync.
        span   a token tree's nodes among the last inputs (pipeline/tree_shape.py): they attend to the context,
               the root and their own ancestors only, at the root's position id plus their depth (static
               forwards only); None: a chain
        """
        if holes:
            self._track_holes(input_ids.device)
        mask = positions = None
        if self.has_holes:
            if valid is None:
                valid = torch.ones_like(input_ids, dtype=torch.bool)
            mask = torch.cat([self.mask, valid], dim=1)                           # [B, length + k]
            positions = (self.n_real[:, None] + valid.long().cumsum(dim=1) - 1).clamp_min(0)
        if span is not None:
            attend, positions = self._tree_attention(input_ids, mask, positions, span)
            logits = self.static(input_ids, self.length, attend, positions, last)
        elif self.static is not None:
            attend = None if mask is None else attention_mask_4d(mask, input_ids.shape[1], "bool", self._dtype)
            logits = self.static(input_ids, self.length, attend, positions, last)
        else:
            logits = self._hf_forward(input_ids, mask, positions, last)
        self.length += input_ids.shape[1]
        if self.has_holes:
            self.mask = mask
            self.n_real = self.n_real + valid.sum(dim=1)
        return logits

    def _tree_attention(self, input_ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor | None,
                        span: TreeSpan) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention (bool [B or 1, 1, k, length + k]) and position ids (int64 [B, k]) of a forward whose last
        ``span.rows`` inputs are tree nodes: causal (and real positions only) before the span, the span's own
        pattern inside it; a node's position is the root's plus its depth."""
        if self.static is None:
            raise SpecsweepError("token trees run on the static-cache forward (GPT-2, Llama): this model's family "
                                 "has none, or --no-static-cache is set")
        B, k = input_ids.shape
        end = self.length + k
        root = end - span.size                                         # the root's cache position
        if mask is None:
            key = torch.arange(end, device=input_ids.device)
            attend = (key <= torch.arange(self.length, end, device=input_ids.device)[:, None])[None, None]
            positions = torch.arange(self.length, end, device=input_ids.device).expand(B, k)
            root_position = torch.full((B, 1), root, dtype=torch.int64, device=input_ids.device)
        else:
            attend = attention_mask_4d(mask, k, "bool", self._dtype)
            root_position = mask[:, :root].sum(dim=1, keepdim=True)
        attend = attend.clone()
        attend[:, :, k - span.rows:, root:] = span.attend
        positions = torch.cat([positions[:, : k - span.rows], root_position + span.depth], dim=1)
        return attend, positions

    def _hf_forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor | None,
                    last: int) -> torch.Tensor:
        """transformers' forward over the DynamicCache; mask bool [B, length + k] or None (no holes)."""
        kwargs = {"logits_to_keep": last} if last and self._keeps_logits else {}
        if mask is not None:
            kwargs[self._mask] = (mask.long() if self._mask_format == "2d"
                                  else attention_mask_4d(mask, input_ids.shape[1], self._mask_format, self._dtype))
            kwargs[self._pos] = positions
        if self.encoder is not None:
            kwargs["encoder_outputs"] = self.encoder
        kwargs[self._ids] = input_ids
        for m in self._padding_warners:  # an instance attribute shadows the method for this call only
            m.warn_if_padding_and_no_attention_mask = _no_padding_warning
        try:
            out = self.model(past_key_values=self.cache, use_cache=True, **kwargs)
        finally:
            for m in self._padding_warners:
                del m.warn_if_padding_and_no_attention_mask
        return out.logits[:, -last:] if last else out.logits

    def retain(self, k: int, keep: torch.Tensor, max_keep: int, min_keep: int, path: torch.Tensor | None = None,
               nodes: int = 0) -> None:
        """Of the last k cache positions, row b keeps the first keep[b] (int64 [B]); the cache is cropped to
        the longest kept prefix. ``max_keep``/``min_keep`` = keep.max()/min(), passed in because the caller
        has them on the host already; rows that keep fewer than the longest leave holes.

        A token tree's step: the last ``nodes`` positions are its nodes, and path int64 [B, P] the accepted path's
        node indices (-1 after); their entries move to the first P node positions first (in place, static cache)."""
        if path is not None and path.shape[1] and k:
            self.static.keep_path(self.length - nodes, path)
        if k == 0 or min_keep == k:  # every row keeps all k: nothing to roll back
            return
        start = self.length - k
        if min_keep < max_keep:
            self._track_holes(keep.device)
        if self.has_holes:
            recent = self.mask[:, start:] & (torch.arange(k, device=keep.device) < keep[:, None])
            self.mask = torch.cat([self.mask[:, :start], recent], dim=1)[:, : start + max_keep]
            self.n_real = self.mask.sum(dim=1)
        if k > max_keep and self.static is None:  # a static cache just moves its length
            self.cache.crop(-(k - max_keep))
        self.length = start + max_keep

    def truncate(self, cuts: list[int]) -> None:
        """Row b keeps the cache positions before cuts[b] (host ints): later ones become holes, and the cache is
        cropped to the largest cut. Unlike :meth:`retain` a cut may lie before the last step (a draft with another
        tokenizer re-reads text whose tokenisation changed, pipeline/decoding/drafters/cross_tokenizer.py)."""
        end = max(cuts)
        if min(cuts) < end:
            self._track_holes(self.mask.device if self.mask is not None else self._device())
        if self.has_holes:
            cut = torch.tensor(cuts, dtype=torch.int64).to(self.mask.device, non_blocking=True)
            self.mask = (self.mask & (torch.arange(self.length, device=cut.device) < cut[:, None]))[:, :end]
            self.n_real = self.mask.sum(dim=1)
        if end < self.length and self.static is None:
            self.cache.crop(end - self.length)
        self.length = end

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (int64 indices, on the engine's device)."""
        # A model spread over several GPUs (device_map) keeps each layer's cache on that layer's GPU, and an
        # index tensor must live on the indexed tensor's device: copy the rows to each (device to device, no
        # host sync), as HF's own cache reordering for beam search does.
        on_device = {rows.device: rows}
        if self.static is not None:
            self.static.select(rows)
            caches = ()
        elif hasattr(self.cache, "self_attention_cache"):
            caches = (self.cache.self_attention_cache, self.cache.cross_attention_cache)
        else:
            caches = (self.cache,)
        for cache in caches:
            for layer in cache.layers:
                keys = getattr(layer, "keys", None)  # None until the layer has seen a token
                layer.batch_select_indices(rows if keys is None else
                                           on_device.setdefault(keys.device, rows.to(keys.device)))
        self.batch = rows.shape[0]
        if self.has_holes:
            self.mask = self.mask[rows]
            self.n_real = self.n_real[rows]
        if self.encoder is not None:
            self.encoder = (self.encoder[0][on_device.setdefault(self.encoder[0].device,
                                                                 rows.to(self.encoder[0].device))],)
