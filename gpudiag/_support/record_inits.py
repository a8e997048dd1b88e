"""``__init__`` templates of 0 to INITS_MAX parameters, as bytecode on import.

Generated from :func:`gpudiag._support.records.template_source`; do not edit. To write
it again: ``python -m gpudiag._support.records``.
"""


def init0(__record_self__):
    __record_self__.__dict__.update(zip(__record_names__, ()))
    __record_after__(__record_self__)


def init1(__record_self__, _p0):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, )))
    __record_after__(__record_self__)


def init2(__record_self__, _p0, _p1):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, )))
    __record_after__(__record_self__)


def init3(__record_self__, _p0, _p1, _p2):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, )))
    __record_after__(__record_self__)


def init4(__record_self__, _p0, _p1, _p2, _p3):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, )))
    __record_after__(__record_self__)


def init5(__record_self__, _p0, _p1, _p2, _p3, _p4):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, )))
    __record_after__(__record_self__)


def init6(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, )))
    __record_after__(__record_self__)


def init7(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, )))
    __record_after__(__record_self__)


def init8(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, )))
    __record_after__(__record_self__)


def init9(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, )))
    __record_after__(__record_self__)


def init10(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, )))
    __record_after__(__record_self__)


def init11(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, )))
    __record_after__(__record_self__)


def init12(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, )))
    __record_after__(__record_self__)


def init13(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, )))
    __record_after__(__record_self__)


def init14(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, )))
    __record_after__(__record_self__)


def init15(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, )))
    __record_after__(__record_self__)


def init16(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, )))
    __record_after__(__record_self__)


def init17(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, )))
    __record_after__(__record_self__)


def init18(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, )))
    __record_after__(__record_self__)


def init19(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, )))
    __record_after__(__record_self__)


def init20(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, )))
    __record_after__(__record_self__)


def init21(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, )))
    __record_after__(__record_self__)


def init22(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, )))
    __record_after__(__record_self__)


def init23(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, )))
    __record_after__(__record_self__)


def init24(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, )))
    __record_after__(__record_self__)


def init25(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, )))
    __record_after__(__record_self__)


def init26(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, )))
    __record_after__(__record_self__)


def init27(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, )))
    __record_after__(__record_self__)


def init28(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, )))
    __record_after__(__record_self__)


def init29(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, )))
    __record_after__(__record_self__)


def init30(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, )))
    __record_after__(__record_self__)


def init31(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, )))
    __record_after__(__record_self__)


def init32(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, )))
    __record_after__(__record_self__)


def init33(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, )))
    __record_after__(__record_self__)


def init34(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, )))
    __record_after__(__record_self__)


def init35(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, )))
    __record_after__(__record_self__)


def init36(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, )))
    __record_after__(__record_self__)


def init37(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36, )))
    __record_after__(__record_self__)


def init38(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36, _p37):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36, _p37, )))
    __record_after__(__record_self__)


def init39(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36, _p37, _p38):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36, _p37, _p38, )))
    __record_after__(__record_self__)


def init40(__record_self__, _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36, _p37, _p38, _p39):
    __record_self__.__dict__.update(zip(__record_names__, (_p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, _p9, _p10, _p11, _p12, _p13, _p14, _p15, _p16, _p17, _p18, _p19, _p20, _p21, _p22, _p23, _p24, _p25, _p26, _p27, _p28, _p29, _p30, _p31, _p32, _p33, _p34, _p35, _p36, _p37, _p38, _p39, )))
    __record_after__(__record_self__)
