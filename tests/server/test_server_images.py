"""Images through the live server (OpenAI chat completions, the openai client): a base64 PNG
in an `image_url` part gives transformers' greedy tokens on the same image and rendered prompt
(the tiny Qwen3.5 checkpoint, fp32); bad images get 400/413 naming the field and the limit;
nothing leaks."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
import torch

from tests.mm_tiny import IMAGE_IDS, hf_inputs, random_images, save_mm_checkpoint
from tests.server.conftest import MODEL, start_server

FAMILY = "qwen3_5"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from hyla.engine.llm_engine import LLMEngine

    path = tmp_path_factory.mktemp("qwen3_5_server")
    hf = save_mm_checkpoint(FAMILY, path)
    engine = LLMEngine.from_path(str(path), device="cpu", max_model_len=512, block_size=8,
                                 limit_mm_per_prompt=2, max_image_bytes=4096,
                                 allowed_media_domains="127.0.0.1")  # fmt: skip
    engine.model_name = MODEL
    server = start_server(engine)
    yield hf, server
    server.stop()


@pytest.fixture(scope="module")
def served_tokenizer(live):
    return live[1].engine.tokenizer  # the server's own (the prompt is rendered with it)


def data_url(image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(server, content, **kw):
    return server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=8, **kw,
    )  # fmt: skip


def test_base64_image_chat_matches_transformers(live, served_tokenizer):
    hf, server = live
    image = random_images([(20, 28)], seed=1)[0]
    out = chat(server, [image_part(data_url(image)), {"type": "text", "text": "hello world"}],
               logprobs=True, extra_body={"ignore_eos": True})  # fmt: skip
    tok = served_tokenizer
    marker = "<|vision_start|><|image_pad|><|vision_end|>"  # the family's placeholder text
    ids = tok(f"User: {marker}hello world\nAssistant:", add_special_tokens=False)["input_ids"]
    image_id = IMAGE_IDS[FAMILY][0]
    inputs = hf_inputs(FAMILY, [image])
    rows = int(inputs["image_grid_thw"].prod()) // 4
    full = [t for i in ids for t in ([image_id] * rows if i == image_id else [i])]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([full]), max_new_tokens=8, do_sample=False, pad_token_id=0,
            eos_token_id=None, pixel_values=inputs["pixel_values"],
            image_grid_thw=inputs["image_grid_thw"],
            mm_token_type_ids=torch.tensor([[int(t == image_id) for t in full]]),
        )[0, len(full) :].tolist()  # fmt: skip
    want = [tok.decode([t], skip_special_tokens=False) for t in ref]
    assert out.usage.prompt_tokens == len(full)
    assert [c.token for c in out.choices[0].logprobs.content] == want
    stats = server.wait_idle()
    assert stats.encoder_cache_entries == 0 and stats.num_free_blocks == stats.num_total_blocks
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "hyla_encoder_cache_entries 0.0" in metrics and "hyla_encoder_images_total" in metrics


def _error(server, content) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as e:
        chat(server, content)
    return e.value


def test_bad_images_are_refused_naming_the_field_and_limit(live):
    _, server = live
    small = data_url(random_images([(8, 8)])[0])
    field = "messages[0].content[0].image_url"
    cases = [
        ([image_part("https://example.com/cat.png")], 400, field,
         "host 'example.com' is not in the allowed media domains"),
        ([image_part("file:///etc/passwd")], 400, field, "--allowed-local-media-path"),
        ([image_part("data:image/png;base64," + base64.b64encode(b"not a png").decode())],
         400, field, "undecodable"),
        ([image_part("data:image/png;base64,@@@")], 400, field, "base64"),
        ([image_part("data:text/plain;base64,aGk=")], 400, field, "data:image/"),
        ([image_part(data_url(random_images([(64, 64)], seed=2)[0]))], 413, field,
         "max_image_bytes"),
        ([image_part(small)] * 3, 400, "messages[0].content[2]", "limit_mm_per_prompt"),
        ([image_part(small), image_part(small), {"type": "text", "text": "<|image_pad|>"}],
         400, "messages", "3 image placeholders"),
    ]  # fmt: skip
    for content, status, param, limit in cases:
        err = _error(server, content)
        assert err.status_code == status, (limit, err.body)
        assert err.body["param"] == param and limit in err.body["message"], err.body
    stats = server.wait_idle()
    assert stats.encoder_cache_entries == 0 and stats.num_free_blocks == stats.num_total_blocks


def test_a_text_only_model_refuses_an_image(make_server):
    server = make_server()
    err = _error(server, [image_part(data_url(random_images([(8, 8)])[0]))])
    assert err.status_code == 400
    assert err.body["param"] == "messages[0].content[0]" and "no images" in err.body["message"]


def test_an_image_from_an_allowed_host_equals_the_same_image_inline(live):
    """`--allowed-media-domains 127.0.0.1`: an http image URL (a local server) gives the same
    tokens as the same bytes sent as a data URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    _, server = live
    url = data_url(random_images([(20, 28)], seed=3)[0])
    png = base64.b64decode(url.split(",", 1)[1])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

    media = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=media.serve_forever, daemon=True).start()
    try:
        text = {"type": "text", "text": "hello world"}
        remote = f"http://127.0.0.1:{media.server_address[1]}/a.png"
        outs = [chat(server, [image_part(u), text], extra_body={"ignore_eos": True})
                for u in (url, remote)]  # fmt: skip
    finally:
        media.shutdown()
        media.server_close()
    assert outs[0].choices[0].message.content == outs[1].choices[0].message.content
    assert outs[0].usage == outs[1].usage


def test_slow_image_hosts_leave_other_chats_their_threads(live):
    """As many chats with an image on a host that does not answer as the event loop has default
    threads: a text-only chat sent meanwhile is answered before the host answers (their fetches
    run on the server's media threads, not the threads that render every chat); the image chats
    are then served."""
    import os
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    _, server = live
    png = base64.b64decode(data_url(random_images([(20, 28)], seed=3)[0]).split(",", 1)[1])
    release, arrived = threading.Event(), []

    class Stalled(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            arrived.append(1)
            release.wait(20)
            self.send_response(200)
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

    media = ThreadingHTTPServer(("127.0.0.1", 0), Stalled)
    threading.Thread(target=media.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{media.server_address[1]}/a.png"
    default_threads = min(32, (os.cpu_count() or 1) + 4)  # the loop's default executor's size

    def post(content, answers):
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
                "max_tokens": 1}  # fmt: skip
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        answers.append((time.monotonic(), r.status_code))

    image_answers, text_answers = [], []
    senders = [threading.Thread(target=post, args=([image_part(url)], image_answers))
               for _ in range(default_threads)]  # fmt: skip
    try:
        for t in senders:
            t.start()
        deadline = time.monotonic() + 20
        while len(arrived) < min(default_threads, 4) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # every image chat in flight
        text = threading.Thread(target=post, args=("hello world", text_answers))
        text.start()
        text.join(3.0)  # under the server's 5 s media_fetch_timeout
        answered = list(text_answers)
    finally:
        release.set()
        for t in [*senders, text]:
            t.join(60)
        media.shutdown()
        media.server_close()
    assert answered and answered[0][1] == 200, "a text-only chat waited for a slow image host"
    assert [status for _, status in image_answers] == [200] * default_threads
    assert answered[0][0] < min(at for at, _ in image_answers)
