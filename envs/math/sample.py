"""The bundled samples: small GSM8K- and Calc-X-style sets the project wrote itself.

They stand in when no real data is found (the loaders say so once), so the envs, the tests and
the examples run from a fresh clone. Same formats as the real files: GSM8K solutions with
``<<expression=value>>`` calculator annotations and a ``#### answer`` line; Calc-X chains of
``<gadget id="calculator">`` calls with their ``<output>`` and a ``<result>``. Every
annotation and gadget output here is checked against the calculator by the tests.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GSM8K_SAMPLE", "CALCX_SAMPLE", "gsm8k_sample", "calcx_sample"]

#: split -> records in GSM8K's format (``question``, ``answer``).
GSM8K_SAMPLE: dict[str, list[dict[str, str]]] = {
    "test": [
        {
            "question": "A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35 of them. How many muffins are left?",
            "answer": "She makes 24 + 18 = <<24+18=42>>42 muffins.\nAfter selling, 42 - 35 = <<42-35=7>>7 are left.\n#### 7",
        },
        {
            "question": "Tom reads 12 pages a day. How many pages does he read in 3 weeks?",
            "answer": "3 weeks are 3 * 7 = <<3*7=21>>21 days.\nHe reads 21 * 12 = <<21*12=252>>252 pages.\n#### 252",
        },
        {
            "question": "A shirt costs $15 and a pair of pants costs twice as much. How much do 2 shirts and 1 pair of pants cost?",
            "answer": "The pants cost 15 * 2 = $<<15*2=30>>30.\nTwo shirts cost 2 * 15 = $<<2*15=30>>30.\nTogether they cost 30 + 30 = $<<30+30=60>>60.\n#### 60",
        },
        {
            "question": "A garden has 6 rows of 14 tomato plants. A storm destroys 1/4 of the plants. How many plants are left?",
            "answer": "There are 6 * 14 = <<6*14=84>>84 plants.\nThe storm destroys 84 / 4 = <<84/4=21>>21 plants.\nSo 84 - 21 = <<84-21=63>>63 plants are left.\n#### 63",
        },
        {
            "question": "Maria earns $18 per hour and works 7 hours a day, 5 days a week. How much does she earn in a week?",
            "answer": "She earns 18 * 7 = $<<18*7=126>>126 a day.\nIn a week she earns 126 * 5 = $<<126*5=630>>630.\n#### 630",
        },
        {
            "question": "A school bus holds 48 students. How many buses are needed to carry 300 students?",
            "answer": "300 / 48 = <<300/48=6.25>>6.25, so 6 buses are not enough.\nThey need 6 + 1 = <<6+1=7>>7 buses.\n#### 7",
        },
        {
            "question": "Sam had 150 stickers. He gave 20% of them to his sister and 25 to his friend. How many stickers does he have now?",
            "answer": "He gave his sister 150 * 0.2 = <<150*0.2=30>>30 stickers.\nHe has 150 - 30 - 25 = <<150-30-25=95>>95 left.\n#### 95",
        },
        {
            "question": "A car travels at 65 miles per hour for 3 hours and then at 50 miles per hour for 2 hours. How far does it travel in total?",
            "answer": "First it covers 65 * 3 = <<65*3=195>>195 miles.\nThen 50 * 2 = <<50*2=100>>100 miles.\nIn total 195 + 100 = <<195+100=295>>295 miles.\n#### 295",
        },
    ],
    "train": [
        {
            "question": "A pack of 8 pencils costs $2. How much do 56 pencils cost?",
            "answer": "56 pencils are 56 / 8 = <<56/8=7>>7 packs.\nThey cost 7 * 2 = $<<7*2=14>>14.\n#### 14",
        },
        {
            "question": "Lena is 4 years older than her brother, who is 9. In how many years will Lena be 20?",
            "answer": "Lena is 9 + 4 = <<9+4=13>>13.\nShe will be 20 in 20 - 13 = <<20-13=7>>7 years.\n#### 7",
        },
        {
            "question": "A rectangle is 12 meters long and 5 meters wide. What is its perimeter in meters?",
            "answer": "Length and width add up to 12 + 5 = <<12+5=17>>17 meters.\nThe perimeter is 17 * 2 = <<17*2=34>>34 meters.\n#### 34",
        },
        {
            "question": "A farmer collects 45 eggs a day and packs them in cartons of 12. How many full cartons does he fill in 4 days?",
            "answer": "In 4 days he collects 45 * 4 = <<45*4=180>>180 eggs.\nThat fills 180 / 12 = <<180/12=15>>15 cartons.\n#### 15",
        },
        {
            "question": "A movie ticket costs $12.50. How much do 6 tickets cost?",
            "answer": "6 tickets cost 12.5 * 6 = $<<12.5*6=75>>75.\n#### 75",
        },
        {
            "question": "Jake saves $35 each week. How many weeks does he need to save $420?",
            "answer": "He needs 420 / 35 = <<420/35=12>>12 weeks.\n#### 12",
        },
        {
            "question": "A library had 1,200 books. It bought 350 more and gave away 175. How many books does it have now?",
            "answer": "After buying it had 1200 + 350 = <<1200+350=1550>>1550 books.\nNow it has 1550 - 175 = <<1550-175=1375>>1375 books.\n#### 1375",
        },
        {
            "question": "Half of the 40 students in a class walk to school, and a quarter of the others take the bus. How many students take the bus?",
            "answer": "20 students walk: 40 / 2 = <<40/2=20>>20, and 20 do not.\nA quarter of those is 20 / 4 = <<20/4=5>>5.\n#### 5",
        },
    ],
}


def _chain(*steps: tuple[str, str], result: str) -> str:
    calls = [f'<gadget id="calculator">{expr}</gadget>\n<output>{out}</output>' for expr, out in steps]
    return "\n\n".join([*calls, f"<result>{result}</result>"])


#: split -> records in Calc-X's format (``id``, ``question``, ``chain``, ``result``, ``source``).
CALCX_SAMPLE: dict[str, list[dict[str, str]]] = {
    "test": [
        {
            "id": "sample__calc_0",
            "question": "A rope 7.5 meters long is cut into pieces of 1.5 meters. How many pieces are there?",
            "chain": _chain(("7.5 / 1.5", "5"), result="5"),
            "result": "5",
        },
        {
            "id": "sample__calc_1",
            "question": "What is 3/8 of 96?",
            "chain": _chain(("3 / 8", "3/8 = around 0.375"), ("(3/8) * 96", "36"), result="36"),
            "result": "36",
        },
        {
            "id": "sample__calc_2",
            "question": "A number is divided by 4 and then increased by 6, which gives 15. What is the number?",
            "chain": _chain(("15 - 6", "9"), ("9 * 4", "36"), result="36"),
            "result": "36",
        },
        {
            "id": "sample__calc_3",
            "question": "The price of a book drops from 80 yuan to 60 yuan. By what fraction of the old price did it drop?",
            "chain": _chain(("80 - 60", "20"), ("20 / 80", "1/4 = around 0.25"), result="1/4"),
            "result": "1/4",
        },
        {
            "id": "sample__calc_4",
            "question": "A worker makes 18 parts in 3 hours. How many parts does he make in 8 hours?\nChoose the correct choice\nA) 36 B) 42 C) 48 D) 54 E) 60",
            "chain": _chain(("18 / 3", "6"), ("6 * 8", "48"), result="C"),
            "result": "C",
        },
    ],
    "train": [
        {
            "id": "sample__calc_5",
            "question": "A train covers 360 km in 4.5 hours. What is its speed in km per hour?",
            "chain": _chain(("360 / 4.5", "80"), result="80"),
            "result": "80",
        },
        {
            "id": "sample__calc_6",
            "question": "A tank holds 240 liters and is 5/8 full. How many liters are in it?",
            "chain": _chain(("240 * (5/8)", "150"), result="150"),
            "result": "150",
        },
        {
            "id": "sample__calc_7",
            "question": "If 2/3 of a number is 18, what is 5/6 of the number?",
            "chain": _chain(("18 / (2/3)", "27"), ("27 * (5/6)", "45/2 = around 22.5"), result="45/2 = around 22.5"),
            "result": "45/2 = around 22.5",
        },
        {
            "id": "sample__calc_8",
            "question": "What is 7/12 minus 1/4?",
            "chain": _chain(("7/12 - 1/4", "1/3 = around 0.333333"), result="1/3"),
            "result": "1/3",
        },
        {
            "id": "sample__calc_9",
            "question": "A circle has a radius of 3 cm. What is its area in square centimeters?",
            "chain": _chain(("pi * 3 ** 2", "28.274334"), result="28.274334"),
            "result": "28.274334",
        },
    ],
}
for _split, _records in CALCX_SAMPLE.items():
    for _r in _records:
        _r["source"] = "sample"


def gsm8k_sample(split: str) -> list[dict[str, Any]]:
    """The sample's records of ``split`` (``test`` or ``train``), as fresh dicts."""
    return [dict(r) for r in GSM8K_SAMPLE[split]]


def calcx_sample(split: str) -> list[dict[str, Any]]:
    """The sample's records of ``split`` (``test`` or ``train``), as fresh dicts."""
    return [dict(r) for r in CALCX_SAMPLE[split]]
