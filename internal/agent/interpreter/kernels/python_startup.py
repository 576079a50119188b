# Run by every Python kernel of the code interpreter at its start (the
# agent passes it as IPKernelApp.exec_files). It registers what E2B's SDKs
# read besides the usual MIME types:
#   e2b/chart  a matplotlib figure as typed data (line, scatter, bar, pie,
#              box and whisker, superchart), alongside its PNG;
#   e2b/data   a pandas DataFrame as {column: [values]};
# and makes PIL's Image.show() display the image as a result. It runs in
# the user's namespace: everything it defines lives inside _airlock_setup,
# which deletes itself.


def _airlock_setup():
    import datetime
    import math
    import re
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    ip = get_ipython()
    if ip is None:
        return

    # A unit is what an axis label says in parentheses or brackets:
    # "Time (s)" -> "s", "Size [MB]" -> "MB".
    unit_re = re.compile(r"\s\((.*?)\)|\[(.*?)\]")

    def text_or_none(s):
        return s if s else None

    def unit_of(label):
        m = unit_re.search(label or "")
        if not m:
            return None
        return m.group(1) if m.group(1) is not None else m.group(2)

    def plain(v):
        """A value as JSON can carry it: numbers as floats, dates as ISO."""
        try:
            import numpy

            if isinstance(v, numpy.datetime64):
                return str(numpy.datetime_as_string(v, unit="s"))
            if isinstance(v, numpy.generic):
                v = v.item()
        except ImportError:
            pass
        if isinstance(v, (datetime.date, datetime.datetime)):
            return v.isoformat()
        if isinstance(v, (bool, int)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        return str(v)

    def base(ax, kind):
        return {"type": kind, "title": text_or_none(ax.get_title()), "elements": []}

    def with_axes(chart, ax, swap=False):
        xl, yl = ax.get_xlabel(), ax.get_ylabel()
        if swap:
            xl, yl = yl, xl
        chart.update(x_label=text_or_none(xl), y_label=text_or_none(yl), x_unit=unit_of(xl), y_unit=unit_of(yl))
        return chart

    def is_grid_line(line):
        x, y = line.get_xdata(), line.get_ydata()
        return len(x) == 2 and len(y) == 2 and (x[0] == x[1] or y[0] == y[1])

    def scale(ax, axis):
        import matplotlib.dates

        a = ax.xaxis if axis == "x" else ax.yaxis
        converter = getattr(a, "get_converter", lambda: a.converter)()
        if isinstance(converter, (matplotlib.dates.DateConverter, matplotlib.dates.ConciseDateConverter)) or type(converter).__name__ == "_SwitchableDateConverter":
            return "datetime"
        s = ax.get_xscale() if axis == "x" else ax.get_yscale()
        if s != "linear":
            return s
        ticks = ax.get_xticks() if axis == "x" else ax.get_yticks()
        labels = [t.get_text() for t in (ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())]
        if ticks is not None and len(ticks) and len(labels) == len(ticks) and all(
            float(t) == i and lab != str(i) for i, (t, lab) in enumerate(zip(ticks, labels))
        ):
            return "categorical"
        return "linear"

    def ticks(ax, axis):
        import matplotlib.dates

        values = ax.get_xticks() if axis == "x" else ax.get_yticks()
        if scale(ax, axis) == "datetime":
            return [matplotlib.dates.num2date(t).isoformat() for t in values]
        return [plain(t) for t in values]

    def point_chart(ax, kind, elements):
        chart = with_axes(base(ax, kind), ax)
        for axis in ("x", "y"):
            chart[axis + "_ticks"] = ticks(ax, axis)
            chart[axis + "_tick_labels"] = [t.get_text() for t in (ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())]
            chart[axis + "_scale"] = scale(ax, axis)
        chart["elements"] = elements
        return chart

    def line_chart(ax):
        elements = []
        for i, line in enumerate(ax.get_lines()):
            if is_grid_line(line):
                continue
            label = line.get_label()
            if label.startswith("_"):
                label = "Line %d" % i
            points = [[plain(x), plain(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
            elements.append({"label": label, "points": points})
        return point_chart(ax, "line", elements)

    def scatter_chart(ax):
        elements = []
        for i, col in enumerate(ax.collections):
            label = col.get_label()
            if label.startswith("_"):
                label = "Series %d" % i
            elements.append({"label": label, "points": [[plain(x), plain(y)] for x, y in col.get_offsets()]})
        return point_chart(ax, "scatter", elements)

    def bar_chart(ax):
        from matplotlib.container import BarContainer

        containers = [c for c in ax.containers if isinstance(c, BarContainer)]
        if not containers:
            return None
        # Horizontal bars (barh) share their left edge; vertical ones their bottom.
        horizontal = getattr(containers[0], "orientation", None) == "horizontal"
        chart = with_axes(base(ax, "bar"), ax, swap=horizontal)
        labels = [t.get_text() for t in (ax.get_yticklabels() if horizontal else ax.get_xticklabels())]
        tick_at = {}
        for t, lab in zip(ax.get_yticks() if horizontal else ax.get_xticks(), labels):
            tick_at[round(float(t), 6)] = lab
        for g, container in enumerate(containers):
            group = container.get_label()
            if not group or group.startswith("_"):
                group = "Group %d" % g
            for r in container:
                # The bar's label is the tick label at its centre, where
                # there is one (categories); else its position.
                if horizontal:
                    centre, value = r.get_y() + r.get_height() / 2, r.get_width()
                else:
                    centre, value = r.get_x() + r.get_width() / 2, r.get_height()
                label = tick_at.get(round(centre, 6)) or plain(round(centre, 6))
                chart["elements"].append({"label": str(label), "value": plain(value), "group": group})
        return chart

    def pie_chart(ax):
        chart = base(ax, "pie")
        for w in ax.patches:
            # In degrees; theta is kept in single precision: 90 % is
            # 323.999991 before rounding.
            angle = round(abs(w.theta2 - w.theta1), 4)
            chart["elements"].append({"label": w.get_label(), "angle": plain(angle), "radius": plain(w.r)})
        return chart

    def box_chart(ax):
        # What Axes.bxp drew, as the hook below kept it: the statistics
        # themselves, not a reading of the lines they became.
        stats, vertical = ax._airlock_boxes
        chart = with_axes(base(ax, "box_and_whisker"), ax, swap=not vertical)
        labels = [t.get_text() for t in (ax.get_xticklabels() if vertical else ax.get_yticklabels())]
        for i, st in enumerate(stats):
            label = st.get("label")
            if label is None:
                label = labels[i] if i < len(labels) else str(i + 1)
            chart["elements"].append({
                "label": str(label),
                "min": plain(st["whislo"]), "first_quartile": plain(st["q1"]), "median": plain(st["med"]),
                "third_quartile": plain(st["q3"]), "max": plain(st["whishi"]),
                "outliers": [plain(v) for v in st.get("fliers", [])],
            })
        return chart

    def hook_boxplots(axes_module):
        # Every box plot (plt.boxplot, pandas, seaborn) is drawn by
        # Axes.bxp from its statistics: keep them on the axes.
        Axes = axes_module.Axes
        bxp = Axes.bxp
        if getattr(bxp, "_airlock", False):
            return

        def recorded_bxp(self, bxpstats, *args, **kwargs):
            vertical = kwargs.get("vert", True)
            if kwargs.get("orientation") is not None:
                vertical = kwargs["orientation"] == "vertical"
            if vertical is None:
                vertical = True
            kept = getattr(self, "_airlock_boxes", ([], vertical))[0]
            self._airlock_boxes = (kept + [dict(st) for st in bxpstats], vertical)
            return bxp(self, bxpstats, *args, **kwargs)

        recorded_bxp._airlock = True
        Axes.bxp = recorded_bxp

    # matplotlib is hooked once something imports it, not here: importing
    # it would add half a second to every kernel's start.
    if "matplotlib.axes" in sys.modules:
        hook_boxplots(sys.modules["matplotlib.axes"])
    else:
        import importlib.abc

        class HookMatplotlib(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "matplotlib.axes":
                    return None
                sys.meta_path.remove(self)
                try:
                    import importlib.util

                    spec = importlib.util.find_spec(name)
                finally:
                    sys.meta_path.insert(0, self)
                if spec is None or spec.loader is None:
                    return spec
                exec_module = spec.loader.exec_module

                def exec_and_hook(module):
                    exec_module(module)
                    hook_boxplots(module)
                    if self in sys.meta_path:
                        sys.meta_path.remove(self)

                spec.loader.exec_module = exec_and_hook
                return spec

        sys.meta_path.insert(0, HookMatplotlib())

    def chart_of(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.lines import Line2D
        from matplotlib.patches import Rectangle, Wedge

        if getattr(ax, "_airlock_boxes", None):
            return box_chart(ax)
        drawn = [c for c in ax.lines if not is_grid_line(c)] + list(ax.collections) + list(ax.patches)
        # Lines, with the bands seaborn shades around them besides.
        if any(isinstance(c, Line2D) for c in drawn) and all(
            isinstance(c, Line2D) or type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection") for c in drawn
        ):
            return line_chart(ax)
        if drawn and all(isinstance(c, PathCollection) for c in drawn):
            return scatter_chart(ax)
        if drawn and all(isinstance(c, Wedge) for c in drawn):
            return pie_chart(ax)
        # Bars, with error bars or a line on them (pandas, seaborn) besides.
        if any(isinstance(c, Rectangle) for c in drawn) and all(
            isinstance(c, (Rectangle, Line2D)) or type(c).__name__ == "LineCollection" for c in drawn
        ):
            chart = bar_chart(ax)
            if chart is not None:
                return chart
        return base(ax, "unknown")

    def figure_chart(fig):
        axes = [ax for ax in fig.get_axes() if ax.has_data()]
        if not axes:
            return None
        if len(axes) == 1:
            return chart_of(axes[0])
        suptitle = getattr(fig, "_suptitle", None)
        return {"type": "superchart", "title": suptitle.get_text() if suptitle is not None else "", "elements": [chart_of(ax) for ax in axes]}

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")

        def __call__(self, obj):
            if "matplotlib" in sys.modules:
                from matplotlib.figure import Figure

                if isinstance(obj, Figure):
                    try:
                        return figure_chart(obj)
                    except Exception:
                        return None  # the PNG still goes out
            return super().__call__(obj)

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")

        def __call__(self, obj):
            if "pandas" in sys.modules:
                import pandas

                if isinstance(obj, pandas.DataFrame):
                    try:
                        data = obj.to_dict(orient="list")
                        return {str(k): [plain(v) for v in vs] for k, vs in data.items()}
                    except Exception:
                        return None
            return super().__call__(obj)

    formatters = ip.display_formatter.formatters
    formatters["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)
    formatters["e2b/data"] = DataFormatter(parent=ip.display_formatter)

    # PIL: Image.show() displays the image as a result (there is no screen);
    # the image's own PNG representation is what E2B's template sends too.
    def hook_pil():
        try:
            from PIL import Image, ImageShow
        except ImportError:
            return
        from IPython.display import display

        def show(image, title=None, **options):
            display(image)

        Image.Image.show = show
        ImageShow.show = lambda image, title=None, **options: (display(image), True)[1]

    hook_pil()


_airlock_setup()
del _airlock_setup
