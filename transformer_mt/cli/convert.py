"""`mt export` and `mt import`: models to and from other toolkits (transformer_mt.convert)."""

from pathlib import Path
from typing import Annotated

import typer

from transformer_mt.cli.common import CheckpointOpt, app, note, user_errors
from transformer_mt.errors import MTError


@app.command()
@user_errors
def export(
    checkpoint: CheckpointOpt,
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write.")],
    format: Annotated[
        str, typer.Option("--format", help="Export format: ctranslate2.")
    ] = "ctranslate2",
    quantization: Annotated[
        str,
        typer.Option(help="float32, int8, int8_float32, int8_bfloat16, bfloat16 or float16."),
    ] = "float32",
) -> None:
    """Export a checkpoint for fast inference elsewhere (CTranslate2: int8 on CPUs).

    Translate with it by `mt translate --engine ct2 -c DIR`, or with CTranslate2 directly; the
    directory holds the sentencepiece models and the run's decode settings too.
    """
    from transformer_mt.convert.ctranslate2 import check_export_output, export_ctranslate2
    from transformer_mt.engines import load_for_inference

    if format != "ctranslate2":
        raise MTError(f"--format {format!r}: the only export format is ctranslate2")
    check_export_output(output, [checkpoint])  # before any work; it never holds the checkpoint
    loaded = load_for_inference(checkpoint, pack=False)  # the checkpoint's own fp32 weights
    out = export_ctranslate2(loaded, output, quantization, str(checkpoint), inputs=[checkpoint])
    note(
        f"wrote {out} (CTranslate2, {quantization}); translate with: mt translate --engine ct2 -c {out}"
    )


@app.command("import")
@user_errors
def import_(
    source: Annotated[
        str, typer.Argument(help="A model directory, or a name on the Hugging Face hub.")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="The checkpoint to write.")],
    from_: Annotated[str, typer.Option("--from", help="The model's format: hf.")] = "hf",
) -> None:
    """Turn a published model into a checkpoint: a Hugging Face MarianMTModel (OPUS-MT).

    The checkpoint then works as a trained one: mt translate, evaluate, score, serve, export,
    and mt train --init-from to fine-tune it. A name that is not a directory is fetched from the
    hub (needs the hf extra: pip install 'transformer-mt\\[hf]').
    """
    from transformer_mt.convert.marian import import_marian

    if from_ != "hf":
        raise MTError(f"--from {from_!r}: the only format is hf (a Hugging Face MarianMTModel)")
    summary = import_marian(source, output)
    tags = summary["lang_tags"]
    targets = f"; targets (--target-lang): {', '.join(tags)}" if tags else ""
    note(f"wrote {output} from {source}{targets}; translate with: mt translate -c {output}")
