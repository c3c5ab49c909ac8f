"""sample.py prints each token's text as generate() produces it (its on_token callback), and the printed text is
the whole decoded sample, as it was printed at the end before: multi-byte UTF-8 characters that the byte tokenizer
emits a byte at a time are held back until they are whole, and a prompt of whitespace only is not printed."""
import importlib

import torch

import generate as gen
from common import decode_bytes, encode_bytes, model_from_checkpoint

samplepy = importlib.import_module("sample")


def test_generate_calls_on_token_with_every_new_token_as_it_comes():
    import model_vanilla
    torch.manual_seed(0)
    model = model_vanilla.GPT(model_vanilla.GPTConfig(vocab_size=257, block_size=16, n_layer=1, n_head=2,
                                                      n_kv_head=1, n_embd=16, ffn_hidden=32)).eval()
    idx = torch.randint(0, 257, (1, 5))
    seen = []
    y = gen.generate(model, idx, 20, temperature=0, on_token=lambda t: seen.append(t.clone()))
    assert len(seen) == 20 and torch.equal(torch.cat(seen, dim=1), y[:, 5:])  # past the window of 16 too
    assert torch.equal(gen.generate(model, idx, 20, temperature=0), y)


def test_printer_holds_back_incomplete_characters(capsys):
    text = "ROMEO: héllo €, 😀 naïve\n"
    ids = encode_bytes(text)
    printer, pieces = samplepy.Printer(decode_bytes, ids[:3]), []
    pieces.append(capsys.readouterr().out)
    for i in ids[3:]:
        printer(torch.tensor([[i]]))
        pieces.append(capsys.readouterr().out)
    printer.show(final=True)
    pieces.append(capsys.readouterr().out)
    assert "".join(pieces) == text + "\n" and not any("\ufffd" in p for p in pieces)
    assert sum(bool(p) for p in pieces) > len(text) - 5  # a piece per character, as each is whole
    samplepy.Printer(decode_bytes, encode_bytes(" \n"), hide=" \n")  # a whitespace prompt: not printed
    assert capsys.readouterr().out == ""


def test_sample_py_streams_the_same_text_it_printed_whole(tiny_run, script, capsys, monkeypatch):
    """The printed samples equal the decoded samples, and text was printed while generate() still ran."""
    generate, during = gen.generate, []

    def watched(*args, on_token=None, **kwargs):
        def each(token):
            on_token(token)
            during.append(capsys.readouterr().out)  # what was printed by this token, taken out of the capture
        return generate(*args, on_token=each if on_token else None, **kwargs)
    monkeypatch.setattr(gen, "generate", watched)
    code, out, err = script("sample.py", "--out_dir", tiny_run, "--start", "ROMEO:", "--num_samples=2",
                            "--max_new_tokens=40", "--temperature=0", "--device=cpu")
    assert code == 0, err
    model, _, _ = model_from_checkpoint(str(tiny_run))
    y = generate(model.eval(), torch.tensor([encode_bytes("ROMEO:")]), 40, temperature=0)
    want = decode_bytes(y[0].tolist()) + "\n---------------\n"
    assert "".join(during) + out == 2 * want  # all that was printed, while generating and after
    assert len(during) == 80 and during[0].startswith("ROMEO:")  # the prompt, with the first token
    streamed = "".join(during[:39])  # the first sample before its last token
    assert len(streamed) > len("ROMEO:") and want.startswith(streamed)
