"""Modbus register maps as validated data: decode, encode and read planning (pure).

Nothing here does I/O, reads a clock or imports pymodbus: `rackplane.io.modbus` (the daemon's
owner task) and `sims.modbus_face` (the simulators' server) both build on these functions, so
the daemon and the simulator read the same map the same way (DESIGN §4).

Register map TOML (format defined by ``config/registers/cdu-generic.toml``)::

    [device]
    name = "cdu-generic"          # topic/tag safe
    description = "..."
    default_order = "ABCD"        # applies to multi-register types without their own `order`

    [[points]]
    name = "supply_temp_c"        # time-series field name: lower-case snake case, unit in name
    table = "input"               # holding FC03/06/16, input FC04, coil FC01/05, discrete FC02
    address = 0                   # 0-based protocol address ("30001" only in comments)
    type = "float32"              # int16 uint16 int32 uint32 float32 int64 uint64 float64 bool
    order = "CDAB"                # see "Word and byte order" below
    scale = 1.0                   # engineering = raw * scale + offset  (scale > 0)
    offset = 0.0
    unit = "degC"
    valid_min = -10.0             # outside [valid_min, valid_max] -> Quality.OUT_OF_RANGE
    valid_max = 95.0
    sentinels = [0x8000]          # raw "no sensor" values -> Quality.BAD, reason "sentinel"
    writable = false              # only holding / coil; requires write_min / write_max
    write_min = 0.0               # every write is refused outside these (engineering units)
    write_max = 100.0

Word and byte order (exact definition). Take the value's big-endian byte string: ``A B C D``
for 32-bit types (A most significant), ``A B C D E F G H`` for 64-bit types. An order is two
independent properties:

========  ===================  =====================  ==============================
order     word order           bytes in each word     32-bit registers / 64-bit
========  ===================  =====================  ==============================
ABCD      high word first      as sent (big-endian)   [AB, CD] / [AB, CD, EF, GH]
CDAB      low word first       as sent                [CD, AB] / [GH, EF, CD, AB]
BADC      high word first      swapped                [BA, DC] / [BA, DC, FE, HG]
DCBA      low word first       swapped                [DC, BA] / [HG, FE, DC, BA]
========  ===================  =====================  ==============================

So for 64-bit types "CDAB" means *low word first* (word order 4-3-2-1, what pymodbus calls
``word_order="little"`` and Modbus Poll "little-endian byte swap"), the analogue of the 32-bit
word swap of FIELD-CASES BR-01; it is not the "3412" half swap. 16-bit types have one word:
only the byte-swap part can apply, and only when the point sets ``order`` itself (BADC or
DCBA); the device's ``default_order`` applies to multi-register types only, so a device whose
floats are DCBA never has its int16 registers byte-swapped by accident.

Sentinels are compared with the raw *unsigned* value after the order is undone: the 16-bit
register for 16-bit types (0x8000, not -32768), the whole 32/64-bit unsigned integer for wider
types (for floats: the IEEE bit pattern, e.g. 0x7FC00000).

Values are Python floats (``Sample.value``): 64-bit integer points beyond 2**53 lose precision.

Read planning merges points of one table into requests of at most 125 registers or 2000 bits
(MODBUS Application Protocol Specification V1.1b3 §6.1-6.4) and at most the device's own
limit, across unimplemented gaps of at most ``max_gap`` addresses. What a device rejected is
remembered in a `ReadMemory` (FIELD-CASES BR-05): exception 2 marks the gap addresses of the
failed request as never to be covered again (or, without gaps, reads those points alone);
exception 3 shrinks the request size along `SHRINK_LADDER`.
"""


from rackplane.core.registers import codec as _codec
from rackplane.core.registers import encoder as _encoder
from rackplane.core.registers import maps as _maps
from rackplane.core.registers import planning as _planning
from rackplane.core.registers.codec import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.core.registers.encoder import *  # noqa: F403
from rackplane.core.registers.maps import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.core.registers.planning import *  # noqa: F403 (the package's public names: its modules' __all__)

__all__: list[str] = []
__all__ += _codec.__all__
__all__ += _encoder.__all__
__all__ += _maps.__all__
__all__ += _planning.__all__
