"""Small fixture records in the schema of the real benchmark task files (same file names, same
keys, same JSON layout), written by the tests themselves so every loader, judge and collection
path runs on a fresh clone without ../shared/benchmarks. The text is made up; the ids the judge
tests name (Allrecipes--0, united_13, ...) exist here too, with the structure those tests rely on
(e.g. united_13: four plain rubric criteria worth 4, 2, 2, 3 points and one conditional worth 3).
"""
from __future__ import annotations

import hashlib
import json
import pathlib

WEBVOYAGER_SITES = (("Allrecipes", "https://www.allrecipes.com/"), ("Amazon", "https://www.amazon.com/"),
                    ("Apple", "https://www.apple.com/"), ("ArXiv", "https://arxiv.org/"),
                    ("GitHub", "https://github.com/"), ("Booking", "https://www.booking.com/"),
                    ("Coursera", "https://www.coursera.org/"),
                    ("Google Flights", "https://www.google.com/travel/flights/"))
WEBVOYAGER_PER_SITE = 6
NOTICES = {"Allrecipes": " note that review information is real-time", "Booking": ""}
LEVELS = ("easy", "medium", "hard")
MIND2WEB_SITES = ("https://www.gamestop.com/", "https://www.traderjoes.com/", "https://www.united.com/",
                  "https://www.ikea.com/")
UPDATED_SUFFIX = "_110325"


def webvoyager_records() -> list[dict]:
    """Returns the records of WebVoyager_data.jsonl: {web_name, id, ques, web}, 6 tasks per site."""
    return [{"web_name": site, "id": f"{site}--{n}",
             "ques": f"On {site}, find fixture item {n} listed for 2024-03-{n + 10} and report its title.", "web": url}
            for site, url in WEBVOYAGER_SITES for n in range(WEBVOYAGER_PER_SITE)]


def fara_webvoyager_records() -> list[dict]:
    """Returns Fara's edition: task 5 of each site removed, dates moved to 2025."""
    return [dict(r, ques=r["ques"].replace("2024-", "2025-")) for r in webvoyager_records()
            if not r["id"].endswith("--5")]


def molmoweb_webvoyager_records() -> list[dict]:
    """Returns MolmoWeb's edition: Fara's with the dates moved again, to 2026."""
    return [dict(r, ques=r["ques"].replace("2025-", "2026-")) for r in fara_webvoyager_records()]


def reference_answers() -> dict:
    """Returns reference_answer.json: {site: {notice, answers: [{id, type, ans}]}} for every task."""
    return {site: {"notice": NOTICES.get(site, ""),
                   "answers": [{"id": n, "type": "golden" if n % 3 == 0 else "possible", "ans": f"'{site} item {n}'"}
                               for n in range(WEBVOYAGER_PER_SITE)]}
            for site, _ in WEBVOYAGER_SITES}


def gaia_records() -> list[dict]:
    """Returns GAIA_web.jsonl's records {task_id, Level, Final answer, id, web, ques}: 3 of level 1, 2 of level 2."""
    out = []
    for level, count in ((1, 3), (2, 2)):
        for n in range(count):
            out.append({"task_id": _hex(f"gaia-{level}-{n}")[:8] + "-0000-4000-8000-" + _hex(f"{level}{n}")[:12],
                        "Level": level, "Final answer": str(17 + 10 * level + n), "id": f"level{level}-{n}",
                        "web": "https://www.google.com/",
                        "ques": f"Fixture GAIA question {level}.{n}: what number is it?"})
    return out


def mind2web_records() -> list[dict]:
    """Returns Fara's Online-Mind2Web records {task_id, confirmed_task, website, reference_length, level}: 12 tasks."""
    return [{"task_id": _hex(f"om2w-{i}"),
             "confirmed_task": f"Fixture task {i}: open the store page and find offer {i}.",
             "website": MIND2WEB_SITES[i % len(MIND2WEB_SITES)], "reference_length": 3 + i, "level": LEVELS[i % 3]}
            for i in range(12)]


def molmoweb_mind2web_records() -> list[dict]:
    """Returns MolmoWeb's edition: every fourth task updated (new id suffix, new text)."""
    return [dict(r, task_id=r["task_id"] + UPDATED_SUFFIX, confirmed_task=r["confirmed_task"] + " (updated)")
            if i % 4 == 0 else r for i, r in enumerate(mind2web_records())]


def stagehand_mind2web_records() -> list[dict]:
    """Returns Stagehand's edition (JSON Lines): one task edited."""
    records = mind2web_records()
    records[2] = dict(records[2], confirmed_task=records[2]["confirmed_task"].replace("offer", "deal"))
    return records


def _criterion(name: str, points: int, condition: str | None = None) -> dict:
    item = {"criterion": name}
    if condition is not None:
        item["condition"] = condition
    return item | {"description": f"Full credit when the agent does '{name}'; none otherwise.", "max_points": points,
                   "justification": "", "earned_points": ""}


def webtailbench_records() -> list[dict]:
    """Returns Stagehand's WebTailBench records {id, category, ques, web, precomputed_rubric: {items}}:
    10 tasks in 3 categories; questions end in "\\r" as in the real file."""
    united = {"id": "united_13", "category": "flights",
              "ques": "What is the price difference between economy and business class on a fixture airline's "
                      "direct flights from Chicago to São Paulo next month? If there are none, say so\r",
              "web": "", "precomputed_rubric": {"items": [
                  _criterion("Use correct flight constraints", 4), _criterion("Determine economy pricing", 2),
                  _criterion("Determine business pricing", 2), _criterion("Compute and report the difference", 3),
                  _criterion("Report the absence of flights", 3, "Only if no qualifying flights exist")]}}
    michaels = {"id": "michaels_2250", "category": "shopping_head",
                "ques": "Find the price of a fixture craft kit at Michaels and add it to the cart.\r", "web": "",
                "precomputed_rubric": {"items": [
                    _criterion("Find the kit", 2), _criterion("Report the price", 2),
                    _criterion("Add to cart", 1),
                    _criterion("Explain a sold-out kit", 1, "Only if the kit is sold out")]}}
    others = [{"id": f"{category}_{i}", "category": category, "ques": f"Fixture {category} task {i}.\r", "web": "",
               "precomputed_rubric": {"items": [_criterion(f"Step {j} of task {i}", j + 1) for j in range(2 + i % 2)]}}
              for i, category in enumerate(["hotels_head"] * 4 + ["flights"] * 4)]
    return [united, michaels] + others


def molmoweb_webtailbench_records() -> list[dict]:
    """Returns MolmoWeb's WebTailBench summaries {benchmark, id, task_summary}."""
    return [{"benchmark": r["category"], "id": r["id"], "task_summary": r["ques"].rstrip("\r").replace("next month",
                                                                                                      "in 2026")}
            for r in webtailbench_records()]


def _hex(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _jsonl(records, **dumps) -> str:
    return "".join(json.dumps(r, **dumps) + "\n" for r in records)


# file name (relative to the folder, as in the real layout) -> its records
BUILDERS = {
    "webvoyager/WebVoyager_data.jsonl": webvoyager_records,
    "webvoyager/fara_WebVoyager_data_08312025.jsonl": fara_webvoyager_records,
    "webvoyager/molmoweb_webvoyager.jsonl": molmoweb_webvoyager_records,
    "webvoyager/GAIA_web.jsonl": gaia_records,
    "webvoyager/reference_answer.json": reference_answers,
    "online_mind2web/fara_Online_Mind2Web_06042025.json": mind2web_records,
    "online_mind2web/molmoweb_online_mind2web.json": molmoweb_mind2web_records,
    "online_mind2web/stagehand_onlineMind2Web.jsonl": stagehand_mind2web_records,
    "webtailbench/stagehand_WebTailBench_data.jsonl": webtailbench_records,
    "webtailbench/molmoweb_webtailbench.json": molmoweb_webtailbench_records,
}


def file_text(name: str) -> str:
    """Returns the text of fixture file `name`, laid out as the real file is (JSON Lines, or an
    indented JSON list/object; Stagehand's WebTailBench compact with UTF-8 as is)."""
    records = BUILDERS[name]()
    if name.endswith(".jsonl"):
        if name.startswith("webtailbench/"):
            return _jsonl(records, separators=(",", ":"), ensure_ascii=False)
        return _jsonl(records)
    return json.dumps(records, indent=4 if name.startswith("online_mind2web/") else 2)


def write_benchmark_files(folder: str | pathlib.Path) -> dict[str, pathlib.Path]:
    """Writes every fixture file under `folder` in the real layout; returns {file name: path}."""
    paths = {}
    for name in BUILDERS:
        path = pathlib.Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(file_text(name), encoding="utf-8")
        paths[name] = path
    return paths
