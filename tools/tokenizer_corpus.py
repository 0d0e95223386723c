#!/usr/bin/env python3
"""tokenizer_corpus.py - writes the tokenizer test corpus (JSON lines, one string each).

The corpus is what the C tokenizer is compared on against the Hugging Face `tokenizers`
package (tools/tokenizer_ref.py makes the reference on a machine that has it). It is built
to reach every branch of the Qwen pre-tokenizer regex, of NFC and of added-token matching:
many scripts, emoji sequences (ZWJ, skin tones, flags, keycaps, tags), combining marks in
and out of canonical order, every kind of white space in runs, digits of many systems, code,
special tokens inline, contractions in every case, CRLF; then seeded random mixtures of all
of it. Deterministic: the same script writes the same file.

Usage: python3 tools/tokenizer_corpus.py > tests/fixtures/tokenizer/corpus.jsonl
Each line: {"id": N, "group": "...", "text": "..."}.
"""
import json
import random
import sys

rows = []


def add(group, *texts):
    for t in texts:
        rows.append((group, t))


# ---- prose and contractions ------------------------------------------------------------
add('english',
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right, but they've said it'd be fine and we'll see.",
    "It's John's book; isn't it? Don't, won't, can't, shouldn't've.",
    "IT'S JOHN'S BOOK. I'M HERE. YOU'RE THERE. WE'LL GO. THEY'VE GONE. HE'D KNOW.",
    "iT'S mIxEd: 'Re 'rE 'RE 'Ve 'vE 'Ll 'lL 'LL 'S 's 'T 't 'M 'm 'D 'd",
    "'s at the start, and at the end '",
    "Curly quotes: it\u2019s, \u201cquoted\u201d, \u2018single\u2019.",
    "The long s: 'ſ and 'ſt and ſ alone.",
    "rock'n'roll, o'clock, y'all, ma'am, 'tis, 'twas, '90s",
    "Mr. Smith went to Washington D.C. on Jan. 5th, 2024 at 3:45 p.m.",
    "   leading spaces and trailing spaces   ",
    "double  spaces  between  words",
    "A sentence.\nAnother line.\n\nA paragraph after a blank line.",
    "Windows line endings\r\nsecond line\r\n\r\nafter blank\r\n",
    "Old Mac line endings\rsecond\r\rthird",
    "Mixed\n\r\n\r\n\n endings \r \n",
    "Tabs\tbetween\t\twords\t",
    "email me at someone@example.com or visit https://example.org/path?q=1&r=2#frag",
    "Prices: $5.99, \u20ac10, \u00a320.50, \u00a51,000, 50% off!!!",
    "(parentheses) [brackets] {braces} <angles> \"quotes\" 'single'",
    "Ellipsis... and more.... and \u2026 the unicode one",
    "em\u2014dash, en\u2013dash, hyphen-minus, non\u2011breaking hyphen",
    "What?! Really?!? No way!!!",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "e.g. i.e. etc. vs. a.k.a. U.S.A.",
    "",
    " ",
    "a",
    "'",
    "''",
    "'''s",
    "\n",
    "\r\n",
    "\t",
    "x\n",
    "\ny",
    )

# ---- many scripts ----------------------------------------------------------------------
add('scripts',
    "Fran\u00e7ais: l'\u00e9l\u00e8ve a re\u00e7u \u00e7a \u00e0 No\u00ebl, o\u00f9 est le ma\u00efs?",
    "Deutsch: Gr\u00fc\u00dfe aus M\u00fcnchen, Stra\u00dfe, \u00c4rger, \u1e9e",
    "Espa\u00f1ol: \u00bfD\u00f3nde est\u00e1 el ni\u00f1o? \u00a1Ma\u00f1ana!",
    "Polski: Za\u017c\u00f3\u0142\u0107 g\u0119\u015bl\u0105 ja\u017a\u0144",
    "\u010ce\u0161tina: P\u0159\u00edli\u0161 \u017elu\u0165ou\u010dk\u00fd k\u016f\u0148 \u00fap\u011bl \u010f\u00e1belsk\u00e9 \u00f3dy",
    "T\u00fcrk\u00e7e: \u0130stanbul'da \u0131\u015f\u0131k, \u011f\u00fc\u015f",
    "Ti\u1ebfng Vi\u1ec7t: Xin ch\u00e0o, t\u00f4i l\u00e0 ng\u01b0\u1eddi Vi\u1ec7t Nam. \u0110\u1eb9p qu\u00e1!",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac: \u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5, \u03c2\u03c3\u03a3 \u0390\u03b0",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439: \u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u043b\u043a\u0430, \u0439\u043e\u0433\u0443\u0440\u0442.",
    "\u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430: \u0491\u0430\u043d\u043e\u043a, \u0457\u0436\u0430\u043a, \u0454\u0434\u043d\u0456\u0441\u0442\u044c",
    "\u0540\u0561\u0575\u0565\u0580\u0565\u0576: \u0532\u0561\u0580\u0587 \u0571\u0565\u0566",
    "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8: \u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u05e2\u05d1\u05e8\u05d9\u05ea: \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u05e0\u05b4\u05e7\u05bc\u05d5\u05bc\u05d3: \u05d1\u05bc\u05b0\u05e8\u05b5\u05d0\u05e9\u05b4\u05c1\u05d9\u05ea \u05d1\u05bc\u05b8\u05e8\u05b8\u05d0",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629: \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0628\u0650\u0633\u0652\u0645\u0650 \u0671\u0644\u0644\u064e\u0651\u0670\u0647\u0650 \u0671\u0644\u0631\u064e\u0651\u062d\u0652\u0645\u064e\u0670\u0646\u0650",
    "\u0641\u0627\u0631\u0633\u06cc: \u0633\u0644\u0627\u0645 \u062f\u0646\u06cc\u0627\u200c\u0647\u0627",
    "\u0627\u0631\u062f\u0648: \u06c1\u06cc\u0644\u0648 \u062f\u0646\u06cc\u0627",
    "\u0939\u093f\u0928\u094d\u0926\u0940: \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, \u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f",
    "\u0915\u093c \u0916\u093c \u0917\u093c \u091c\u093c \u0921\u093c \u0922\u093c \u092b\u093c \u092f\u093c \u0929 \u0931 \u0934",
    "\u09ac\u09be\u0982\u09b2\u09be: \u0986\u09ae\u09bf \u09ac\u09be\u0982\u09b2\u09be\u09af\u09bc \u0997\u09be\u09a8 \u0997\u09be\u0987, \u09cb \u09c7\u09be",
    "\u0a2a\u0a70\u0a1c\u0a3e\u0a2c\u0a40: \u0a38\u0a24 \u0a38\u0a4d\u0a30\u0a40 \u0a05\u0a15\u0a3e\u0a32",
    "\u0a97\u0ac1\u0a9c\u0ab0\u0abe\u0aa4\u0ac0: \u0aa8\u0aae\u0ab8\u0acd\u0aa4\u0ac7",
    "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd: \u0bb5\u0ba3\u0b95\u0bcd\u0b95\u0bae\u0bcd \u0b89\u0bb2\u0b95\u0bae\u0bcd \u0bca \u0bcb \u0bcc",
    "\u0c24\u0c46\u0c32\u0c41\u0c17\u0c41: \u0c28\u0c2e\u0c38\u0c4d\u0c15\u0c3e\u0c30\u0c02 \u0c48",
    "\u0c95\u0ca8\u0ccd\u0ca8\u0ca1: \u0ca8\u0cae\u0cb8\u0ccd\u0c95\u0cbe\u0cb0 \u0cc0 \u0cc7 \u0cca \u0ccb",
    "\u0d2e\u0d32\u0d2f\u0d3e\u0d33\u0d02: \u0d28\u0d2e\u0d38\u0d4d\u0d15\u0d3e\u0d30\u0d02 \u0d4a \u0d4b \u0d4c",
    "\u0dc3\u0dd2\u0d82\u0dc4\u0dbd: \u0d86\u0dba\u0dd4\u0db6\u0ddd\u0dc0\u0db1\u0dca \u0dda \u0ddc \u0ddd \u0dde",
    "\u0e44\u0e17\u0e22: \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e07\u0e48\u0e32\u0e22\u0e21\u0e32\u0e01 \u0e33",
    "\u0ea5\u0eb2\u0ea7: \u0eaa\u0eb0\u0e9a\u0eb2\u0e8d\u0e94\u0eb5 \u0eb3",
    "\u0f56\u0f7c\u0f51\u0f0b\u0f61\u0f72\u0f42: \u0f56\u0f40\u0fb2\u0f0b\u0f64\u0f72\u0f66\u0f0b\u0f56\u0f51\u0f7a\u0f0b\u0f63\u0f7a\u0f42\u0f66\u0f0d \u0f73 \u0f75 \u0f81",
    "\u1019\u103c\u1014\u103a\u1019\u102c: \u1019\u1004\u103a\u1039\u1002\u101c\u102c\u1015\u102b \u1026",
    "\u1781\u17d2\u1798\u17c2\u179a: \u179f\u17bd\u179f\u17d2\u178f\u17b8 \u17be \u17c4",
    "\u12a0\u121b\u122d\u129b: \u1230\u120b\u121d \u1208\u12d3\u1208\u121d",
    "\u13e3\u13b3\u13a9: \u13a3\u13cf\u13f2",
    "\u1818\u1823\u1829\u182d\u1823\u182f: \u1830\u1820\u1822\u1828 \u180b \u180e\u1820",
    "\u16a0\u16a2\u16a6\u16a8\u16b1\u16b2 \u16eb \u16ec",
    "\u4e2d\u6587\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
    "\u7e41\u9ad4\u4e2d\u6587\uff1a\u6b61\u8fce\u4f86\u5230\u81fa\u7063\u3002\u9f8d\u9f9c\u9b31",
    "\u65e5\u672c\u8a9e\uff1a\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
    "\u534a\u89d2\uff76\uff80\uff76\uff85 \uff8a\uff9f\uff8b\uff9f \uff76\uff9e\uff77\uff9e",
    "\u304c\u304e\u3050 \u304b\u3099\u304d\u3099\u304f\u3099 \u30cf\u309a \u30fc\u30fb",
    "\ud55c\uad6d\uc5b4: \uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uae00\uc740 \uc544\ub984\ub2f5\uc2b5\ub2c8\ub2e4.",
    "\u1112\u1161\u11ab\u1100\u1173\u11af \u110b\u1161\u11ab\u1102\u1167\u11bc",
    "\uac00\u11a8 \uac01\u11a8 \u1100\u1161\u11a7 \u3131\u314f \u1100\u1100\u1161\u1161",
    "\ua000\ua001\ua002 \u3105\u3106\u3107 \ua4d0\ua4d1",
    "\U00010330\U00010331\U00010332 \U00010400\U00010428 \U0001e900\U0001e922",
    "\U00020000\U0002a6d6 \U0002b740 \U0002ceb0 \U00030000",
    "Ma\u00f1ana \u00e9t\u00e9 na\u00efve co\u00f6perate r\u00e9sum\u00e9 caf\u00e9 \u00c5ngstr\u00f6m",
    "\u01c4\u01c5\u01c6 \u01c7\u01c8\u01c9 \u1f88\u1f89 \u1fbc",
    "\ufb01 \ufb02 \ufb00 \ufb03 \ufb04 \ufb05 \ufb06",
    )

# ---- combining marks and normalisation --------------------------------------------------
add('nfc',
    "e\u0301",
    "E\u0301 A\u030a a\u0308 o\u0302 n\u0303 c\u0327",
    "cafe\u0301 re\u0301sume\u0301 nai\u0308ve",
    "\u1e0b\u0323",
    "d\u0323\u0307",
    "d\u0307\u0323",
    "q\u0307\u0323",
    "a\u0323\u0302 a\u0302\u0323 \u1ea0\u0302",
    "A\u0301\u0323\u0328",
    "\u00c5 \u212b A\u030a",
    "\u2126 \u03a9 \u212a K",
    "\u0344 \u0308\u0301 \u0958 \u0915\u093c",
    "\u00e9\u0301 \u00e9\u0300\u0301",
    "\u0041\u0327\u0301 \u0043\u0327\u0301",
    "\u05d1\u05bc\u05b8 \u05d1\u05b8\u05bc",
    "\u0627\u0653 \u0627\u0654 \u0648\u0654 \u064a\u0654 \u06d5\u0654",
    "\u0915\u094d\u0937 \u0915\u093c\u094d",
    "\u09c7\u09be \u09c7\u09d7 \u0b47\u0b3e \u0b47\u0b56 \u0bc6\u0bbe \u0bc6\u0bd7 \u0bc7\u0bbe",
    "\u0cbf\u0cd5 \u0cc6\u0cd5 \u0cc6\u0cd6 \u0cc6\u0cc2 \u0cc6\u0cc2\u0cd5",
    "\u0d46\u0d3e \u0d47\u0d3e \u0d46\u0d57",
    "\u0dd9\u0dca \u0dd9\u0dcf \u0dd9\u0dcf\u0dca \u0dd9\u0ddf",
    "\u1025\u102e \u1b05\u1b35 \u1b3a\u1b35 \u1b3e\u1b35 \u1b42\u1b35",
    "\U00011099\U000110ba \U0001109b\U000110ba \U000110a5\U000110ba",
    "\U00011131\U00011127 \U00011132\U00011127 \U00011347\U0001133e \U00011347\U00011357",
    "\U000114b9\U000114ba \U000114b9\U000114b0 \U000114b9\U000114bd \U000115b8\U000115af",
    "\U00011935\U00011930",
    "a\u1df6 a\u1df7\u0301 a\u0301\u1df8 a\u1df9\u0323",
    "a\u0301\u0300\u0302\u0303\u0304\u0305\u0306\u0307\u0308\u0309\u030a\u030b",
    "x\u0315\u0300\u031b\u0301\u0323",
    "\u0301 leading combining mark",
    "\u0301\u0323 two leading marks",
    "  \u0301 after spaces",
    "1\u0301 2\u20e3 #\ufe0f\u20e3",
    "\u1100\u1161\u11a8\u11a8",
    "\u1100\u1100\u1161\u11a8\u11a8",
    "\uac00\u1161 \uac00\u11a8\u11a8 \uac01\u11a8",
    "\u1161\u11a8 standalone jamo",
    "\u0387 \u00b7 \u037e ; \u1fef ` \u1fee \u0385 \u1ffd",
    "\u2000\u2001 \u2002 \u2003",
    "\u2329 \u232a \u3008 \u3009",
    "\uf900 \uf901 \ufa10 \U0002f800 \U0002fa1d",
    "\u0f73 \u0f71\u0f72 \u0f75 \u0f71\u0f74 \u0f81 \u0f71\u0f80",
    "\u0f77 \u0f79 \u0fb2\u0f80 \u0fb3\u0f81",
    "\u1e9b\u0323",
    "\u212b\u0301 \u00c5\u0323",
    "\u03d3 \u03d2\u0301 \u03d4 \u03d2\u0308",
    "\u1fc1 \u00a8\u0342 \u1fed \u1fee",
    "\u0340 \u0341 \u0343 \u0374 \u037e",
    "o\u031b\u0301 \u01a1\u0301 \u1edb",
    "u\u0308\u0304 \u01d6 \u00fc\u0304",
    "\u00e4\u0323 a\u0323\u0308 a\u0308\u0323",
    "\u1f00\u0345 \u1f80 \u03b1\u0313\u0345",
    )

# ---- emoji -------------------------------------------------------------------------------
add('emoji',
    "\U0001f642 \U0001f600\U0001f601\U0001f602",
    "\U0001f44d\U0001f3fb \U0001f44d\U0001f3fc \U0001f44d\U0001f3fd \U0001f44d\U0001f3fe \U0001f44d\U0001f3ff",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "\U0001f469\U0001f3fd\u200d\U0001f4bb coder, \U0001f9d1\U0001f3ff\u200d\U0001f680 astronaut",
    "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f3f4\u200d\u2620\ufe0f",
    "\U0001f1ef\U0001f1f5\U0001f1fa\U0001f1f8\U0001f1e9\U0001f1ea\U0001f1eb\U0001f1f7",
    "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f England",
    "1\ufe0f\u20e3 2\ufe0f\u20e3 #\ufe0f\u20e3 *\ufe0f\u20e3",
    "\u2764\ufe0f \u2764 \u263a\ufe0f \u263a\ufe0e",
    "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1 \U0001f46b\U0001f3fb",
    "\U0001f469\u200d\u2764\ufe0f\u200d\U0001f48b\u200d\U0001f468",
    "I love it\U0001f60d\U0001f60d\U0001f60d!!!",
    "emoji\U0001f600between\U0001f600words",
    " \U0001f600 \U0001f600  \U0001f600",
    "\U0001fae0 \U0001fae8 \U0001f6dd",
    "\u00a9 \u00ae \u2122 \u2b50 \u26a1 \u2603\ufe0f",
    "\U0001f926\U0001f3fc\u200d\u2642\ufe0f \U0001f937\u200d\u2640\ufe0f",
    "\U0001f441\ufe0f\u200d\U0001f5e8\ufe0f",
    )

# ---- white space -------------------------------------------------------------------------
ws_chars = [' ', '\t', '\n', '\r', '\x0b', '\x0c', '\x85', '\xa0', '\u1680', '\u2000', '\u2001',
            '\u2002', '\u2003', '\u2004', '\u2005', '\u2006', '\u2007', '\u2008', '\u2009',
            '\u200a', '\u2028', '\u2029', '\u202f', '\u205f', '\u3000']
not_ws = ['\u180e', '\u200b', '\u200c', '\u200d', '\u2060', '\ufeff', '\x1c', '\x1d', '\x1e',
          '\x1f', '\x00', '\x7f']
for c in ws_chars + not_ws:
    add('whitespace', 'a%sb' % c, 'a%s%sb' % (c, c), '%sword' % c, 'word%s' % c,
        'x %s 1' % c, '!%s!' % c)
add('whitespace',
    "two  three   four    five     spaces",
    "      six before",
    "after six      ",
    "\n\n\n",
    "\n \n \n",
    "  \n  \n  x",
    "\t\t\tindented\n\t\tless\n\tleast\nnone",
    "line\n    indented by four\n        by eight\n",
    "a \n b",
    "a  \n  b",
    "a\n  \n  b",
    "space before newline \nand after\n newline",
    "\r\n\r\n\r\n",
    " \r\n \r\n",
    "trailing crlf\r\n",
    "\u3000\u3000\u5168\u89d2\u7a7a\u767d",
    "nbsp\xa0\xa0\xa0here",
    "mixed \u2003\u2002 \t\xa0 run",
    " " * 40,
    " " * 40 + "x",
    "\t" * 17 + "y",
    "\n" * 12 + "z",
    " \n" * 10,
    "a" + " " * 100 + "b",
    "end with spaces and newline  \n",
    "   !",
    "   1",
    "   \u00e9",
    "   \u0301",
    " !!",
    "\t!!",
    "\n!!",
    " \u4e2d",
    "\xa0hello",
    "\u3000hello",
    "\u2028line separator\u2029paragraph",
    )

# ---- digits and numbers -----------------------------------------------------------------
add('digits',
    "0123456789",
    "1 22 333 4444 55555 666666 7777777",
    "3.14159265358979323846",
    "1,234,567.89 and 1.234.567,89",
    "-42 +42 4e10 0x1F 0b1010 1_000_000",
    "Call +1 (555) 123-4567 or 555.123.4567",
    "2024-01-15T10:30:00Z",
    "v1.2.3-beta.4+build.567",
    "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669 \u06f0\u06f1\u06f2",
    "\u0966\u0967\u0968\u0969 \u09e6\u09e7 \u0e50\u0e51\u0e52 \u0f20\u0f21",
    "\uff10\uff11\uff12\uff13 \u2460\u2461\u2462 \u2474 \u2488",
    "\u00b2\u00b3\u00b9 \u2070\u2074 \u2080\u2081 \u00bc\u00bd\u00be \u2153",
    "\u2160\u2161\u2162 \u216b \u2170\u2171 \u3007 \u3021\u3022",
    "\U0001d7ce\U0001d7cf\U0001d7d0 \U000104a0\U000104a1",
    "a1b2c3 abc123def 123abc abc123",
    "1st 2nd 3rd 4th 21st 100th",
    "\u5e73\u62102024\u5e741\u670815\u65e5",
    "99.9% 0.1\u2030 \u00b110",
    "12345678901234567890123456789012345678901234567890",
    "x=1;y=22;z=333;",
    "\u0661\u0662\u0663abc\u0967\u0968",
    )

# ---- code ----------------------------------------------------------------------------------
add('code',
    "def f(x):\n    return x * 2\n\nprint(f(21))\n",
    "int main(int argc, char **argv)\n{\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; i++) {\n    a[i] += b[i] * c;\n}",
    "{\"key\": \"value\", \"n\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "<html>\n  <body>\n    <p class=\"x\">Hi &amp; bye</p>\n  </body>\n</html>",
    "#!/bin/sh\nset -eu\nfor f in *.txt; do echo \"$f\"; done 2>&1 | tee log\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "const re = /^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@example\\.com$/i;",
    "x += 1; y -= 2; z *= 3; w /= 4; a <<= 1; b >>= 2; c ^= d; e |= f; g &= h;",
    "if (a == b && c != d || !e) { return a->b.c[d]; }",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![0; 16];\n    Ok(())\n}",
    "    # comment\n    x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
    "| col1 | col2 |\n|------|------|\n| a    | b    |\n",
    "```python\nimport os\nprint(os.getcwd())\n```",
    "/usr/local/lib/python3.11/site-packages/foo/__init__.py:42: Warning",
    "C:\\Users\\name\\Documents\\file.txt",
    "git commit -m \"fix: handle CRLF\" && git push origin main",
    "a=>b; c->d; e::f; g<=>h; i!==j; k??l; m?.n; ...rest",
    "0xDEADBEEF 0o755 1e-9 .5 5. 1_000 0b_1010",
    "#include <stdio.h>\r\nint x;\r\n",
    "    \n    \n",
    "\t\n\t\n",
    "<!-- comment --> <![CDATA[x]]> <?xml version=\"1.0\"?>",
    "key: value\nlist:\n  - item1\n  - item2\n",
    "@decorator\nclass A(B, metaclass=M):\n    __slots__ = ('x',)\n",
    "base64: SGVsbG8sIFdvcmxkIQ== aGVsbG8gd29ybGQ=",
    "a" * 300,
    "ab" * 150,
    "xyzzy" * 40,
    "-" * 80,
    "=" * 64 + "\n" + "#" * 33,
    "!?" * 60,
    "\u00e9" * 70,
    "\u4e2d" * 90,
    "\U0001f600" * 30,
    "\ufffd\ufffd replacement chars \ufffd",
    )

# ---- special tokens inline --------------------------------------------------------------
add('special',
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|><|endoftext|>",
    "text<|endoftext|>more text",
    " <|im_end|> ",
    "  <|im_end|>  ",
    "\n<|im_end|>\n",
    "<|im_end|><|im_start|>",
    "<<|im_end|>>",
    "<|im_start",
    "<|im_start|",
    "im_start|>",
    "<|im_start|><|im_start|",
    "<|IM_START|>",
    "< |im_start|>",
    "<|im_start|>\u0301",
    "e<|im_end|>\u0301",
    "e\u0301<|im_end|>e\u0301",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<tool_response>ok</tool_response>",
    "<think>reasoning here</think>answer",
    "<think></think>",
    "</think>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n    return 1<|fim_middle|>",
    "<|repo_name|>sm70<|file_sep|>main.c",
    "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>",
    "<|box_start|>(1,2),(3,4)<|box_end|> <|object_ref_start|>cat<|object_ref_end|>",
    "<|quad_start|><|quad_end|><|video_pad|><|vision_pad|>",
    "Use <|im_start|> to begin and <|im_end|> to end.",
    "\U0001f600<|im_end|>\U0001f600",
    "\u4e2d<|im_end|>\u6587",
    "123<|im_end|>456",
    "'s<|im_end|>'s",
    "<|im_end|>'s",
    "<|im_end|>   x",
    "x   <|im_end|>",
    "\r\n<|im_start|>\r\n",
    "<think>\n<tool_call>\n</tool_call>\n</think>",
    "<|endoftext|>" * 8,
    "<|im_start|>" + "a" * 50 + "<|im_end|>",
    )

# ---- punctuation --------------------------------------------------------------------------
add('punct',
    "!!!???...",
    "...\n\n",
    " ...\n\n  x",
    "?\r\n",
    "?\r\n\r\n",
    " ?\n",
    "a!b?c.d,e;f:g",
    "(a) [b] {c} <d>",
    "\"\"\"docstring\"\"\"",
    "--flag=value -x -- end",
    "***bold*** ___under___ ~~strike~~",
    "\u00bf\u00a1 \u00ab\u00bb \u2039\u203a \u201e\u201c \u300c\u300d \u300e\u300f \u3010\u3011",
    "\u3002\u3001\uff01\uff1f\uff0c\uff1a\uff1b",
    "\u00a7\u00b6\u2020\u2021\u2022\u2023\u2043",
    "\u2190\u2191\u2192\u2193 \u21d2 \u2200\u2203\u2208\u2209 \u221e \u2248 \u2260 \u2264\u2265",
    "+-*/%^&|~<>=",
    "@#$",
    " @#$",
    "  @#$",
    "@#$\n\n\n",
    "@#$ \n",
    " !\n\r\n!",
    "'!'",
    "'''",
    "' s",
    "'\u00e9",
    "'123",
    "'\n",
    "\u00b4s `s \u02bcs",
    "\ue000\ue001 private use \U000f0000 \U0010fffd",
    "\u0378\u0379 unassigned \U000e0080",
    "\uffff\ufffe noncharacters \U0001ffff",
    "\u00ad soft\u00adhyphen",
    "\u200e\u200f\u202a\u202b\u202c\u202d\u202e bidi",
    "\x01\x02\x03\x04\x05\x06\x07\x08 controls \x0e\x0f\x10\x11",
    "\x80\x81\x9f C1 controls",
    )

# ---- probes of characters newer than the tables (Unicode 15.1 / 16.0) ---------------------
add('new-unicode',
    "\U0002ebf0\U0002ebf1 CJK Ext I (15.1)",
    "\U00010d40\U00010d41 Garay (16.0) \ua7cb\ua7cc",
    "\u1c89\u1c8a (16.0)",
    )

# ---- seeded random mixtures ----------------------------------------------------------------
rng = random.Random(20260)
pools = {
    'ascii_letters': 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ',
    'digits': '0123456789',
    'punct': '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~',
    'space': ' ' * 6 + '\t\n\r' + '\xa0\u3000\u2003',
    'latin': '\u00e0\u00e9\u00ee\u00f5\u00fc\u00df\u00e7\u00f1\u0105\u0142\u017c\u0151\u1ebf\u01b0',
    'marks': '\u0300\u0301\u0302\u0303\u0308\u0323\u0327\u0328\u031b\u0345\u05b4\u064b\u093c\u094d\u0e31\u3099\u1df6',
    'greek_cyr': '\u03b1\u03b2\u03b3\u03a9\u03c9\u0430\u0431\u0432\u0416\u044f',
    'cjk': '\u4e00\u4e8c\u4e09\u4eba\u5927\u5b66\u6587\u5b57\u3042\u3044\u30a2\u30a4\uac00\ud55c\uae00',
    'indic': '\u0915\u0916\u0917\u093e\u093f\u0940\u0928\u094d\u09a8\u09be\u0b95\u0bc6\u0bbe\u0e01\u0e32',
    'arabic': '\u0627\u0644\u0639\u0631\u0628\u064a\u0629\u0653\u0654\u0660\u0661',
    'emoji': ['\U0001f600', '\U0001f44d\U0001f3fd', '\U0001f468\u200d\U0001f469\u200d\U0001f467',
              '\u2764\ufe0f', '\U0001f1ef\U0001f1f5', '1\ufe0f\u20e3', '\u200d', '\ufe0f'],
    'jamo': '\u1100\u1101\u1161\u1162\u11a8\u11a9\uac00',
    'special': ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>',
                '<tool_call>', '<|im_start', '|>', '<|'],
    'contraction': ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'\u017f", "'"],
    'other': '\u00a9\u00b0\u00b1\u00d7\u00f7\u2013\u2014\u2026\u20ac\u2192\u221e\u00b2\u00bd\u2160\u2460\ufffd\ue000\u0378\u00ad\u200b\ufeff',
}
names = sorted(pools)
for i in range(760):
    k = rng.choice([1, 2, 3, 4, 6])
    chosen = [rng.choice(names) for _ in range(k)]
    length = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55, 89])
    parts = []
    for _ in range(length):
        pool = pools[rng.choice(chosen)]
        item = rng.choice(pool)
        if rng.random() < 0.2:
            item = item * rng.randint(2, 5)
        parts.append(item)
    add('random-' + '+'.join(sorted(set(chosen))), ''.join(parts))

# words and sentences from pieces, for realistic text mixes
words = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was",
         "on", "be", "at", "by", "this", "had", "not", "are", "but", "from", "or", "have",
         "tokenizer", "appliance", "shared-memory", "GPU", "decode", "Qwen3", "V100",
         "batch", "latency", "throughput", "don't", "it's", "we're", "they'll", "I'd",
         "\u00fcber", "na\u00efve", "\u4f60\u597d", "\u041f\u0440\u0438\u0432\u0435\u0442",
         "\U0001f600", "3.14", "2024", "x86-64", "C++", "e-mail", "\u00e9t\u00e9"]
seps = [" ", " ", " ", ", ", ". ", "! ", "? ", "\n", "  ", " - ", "; ", ":\n", "\r\n", "\t"]
for i in range(140):
    n = rng.randint(3, 40)
    s = ''
    for j in range(n):
        w = rng.choice(words)
        if rng.random() < 0.1:
            w = w.capitalize()
        if rng.random() < 0.05:
            w = w.upper()
        s += w + (rng.choice(seps) if j + 1 < n else '')
    add('sentences', s)

out = sys.stdout
for i, (g, t) in enumerate(rows):
    out.write(json.dumps({"id": i, "group": g, "text": t}, ensure_ascii=True) + "\n")
sys.stderr.write("tokenizer_corpus: %d strings\n" % len(rows))
