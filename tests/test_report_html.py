"""The reports' markdown → HTML page (markdown-it-py: CommonMark + pipe tables, raw HTML escaped)."""
from specbound.experiments.report import markdown_to_html, md_table


def _body(page: str) -> str:
    return page.split("<body>", 1)[1].split("</body>", 1)[0]


def test_table_heading_code_and_link_become_their_html_elements():
    md = ("## Speed-ups\n\nRun with `specbound bench`; see [the analysis](analyze-gsm8k/report.md) and "
          "[the paper](https://arxiv.org/abs/2402.00000).\n\n"
          + md_table(["P", "oracle E[X|T]"], [["1", "0.835"], ["2", "1.580"]]) + "\n")
    page = markdown_to_html(md, title="a <title>")
    body = _body(page)
    assert page.startswith("<!DOCTYPE html>") and "<title>a &lt;title&gt;</title>" in page and "<style>" in page
    assert "<h2>Speed-ups</h2>" in body
    assert "<code>specbound bench</code>" in body
    assert '<a href="analyze-gsm8k/report.html">the analysis</a>' in body          # x.md → x.html
    assert '<a href="https://arxiv.org/abs/2402.00000">the paper</a>' in body
    assert body.count("<table>") == 1 and "<th>P</th>" in body
    assert "<th>oracle E[X|T]</th>" in body                  # an escaped pipe stays inside its cell
    assert "<td>0.835</td>" in body and "<td>1.580</td>" in body


def test_raw_html_in_report_text_is_escaped():
    body = _body(markdown_to_html("A prompt said <script>alert('x')</script> here.\n\n<script>alert(1)</script>\n"))
    assert "<script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_an_image_alone_is_a_captioned_figure():
    body = _body(markdown_to_html("![E[X] per capacity](expected_accepted.png)\n"))
    assert body.strip().startswith('<figure><img src="expected_accepted.png" alt="E[X] per capacity"')
    assert "<figcaption>E[X] per capacity</figcaption></figure>" in body
