"""The standard 1901 start, typed by hand: the tests' independent check on the engine's."""

UNITS = {
    "AUSTRIA": ["A VIE", "A BUD", "F TRI"],
    "ENGLAND": ["F LON", "F EDI", "A LVP"],
    "FRANCE": ["F BRE", "A PAR", "A MAR"],
    "GERMANY": ["F KIE", "A BER", "A MUN"],
    "ITALY": ["F NAP", "A ROM", "A VEN"],
    "RUSSIA": ["A WAR", "A MOS", "F SEV", "F STP/SC"],
    "TURKEY": ["F ANK", "A CON", "A SMY"],
}
CENTERS = {p: [u.split()[1].split("/")[0] for u in us] for p, us in UNITS.items()}
"""Each power's home centers: where its units start."""
