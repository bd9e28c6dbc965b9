"""Model conversion: other toolkits' models in, our checkpoints out to other runtimes.

``marian`` (`mt import --from hf`: an OPUS-MT model -> a checkpoint) and ``ctranslate2``
(`mt export`: a checkpoint -> a CTranslate2 model directory).

The settings file a CTranslate2 export carries is read by the engine that runs it
(:mod:`transformer_mt.engines.ct2`); this package writes it.
"""
