// goroce view: draws the packet ladder of the capture in #data, with no library and no network.
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('data').textContent);
  var NS = 'http://www.w3.org/2000/svg';
  var byN = new Map();
  D.packets.forEach(function (p) { byN.set(p.n, p); });
  var pairsByID = new Map();
  D.pairs.forEach(function (p) { pairsByID.set(p.id, p); });

  var ops = [];
  D.packets.forEach(function (p) { if (ops.indexOf(p.op) < 0) ops.push(p.op); });
  ops.sort();
  var st = { pair: 0, layout: 'seq', zoom: 1, ops: new Set(ops), noted: false, sel: 0 };

  var $ = function (id) { return document.getElementById(id); };
  function el(tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmtT(us) {
    if (us < 1000) return us.toFixed(2) + ' us';
    if (us < 1e6) return (us / 1000).toFixed(3) + ' ms';
    return (us / 1e6).toFixed(6) + ' s';
  }

  // The controls.
  $('counts').textContent = D.file + ': ' + D.counts + '; ' + D.pairs.length + ' queue pair' + (D.pairs.length === 1 ? '' : 's');
  D.pairs.forEach(function (p) {
    var o = document.createElement('option');
    o.value = p.id;
    o.textContent = p.id + ': ' + p.name;
    $('pair').appendChild(o);
  });
  ops.forEach(function (op) {
    var l = document.createElement('label');
    var c = document.createElement('input');
    c.type = 'checkbox';
    c.checked = true;
    c.value = op;
    c.addEventListener('change', function () {
      if (c.checked) st.ops.add(op); else st.ops.delete(op);
      render();
    });
    l.appendChild(c);
    l.appendChild(document.createTextNode(' ' + op));
    $('ops').appendChild(l);
  });
  function setOps(on) {
    st.ops = new Set(on ? ops : []);
    Array.prototype.forEach.call($('ops').querySelectorAll('input'), function (c) { c.checked = on; });
    render();
  }
  $('opsall').addEventListener('click', function () { setOps(true); });
  $('opsnone').addEventListener('click', function () { setOps(false); });
  $('pair').addEventListener('change', function () { st.pair = +$('pair').value; render(); });
  $('layout').addEventListener('change', function () { st.layout = $('layout').value; render(); });
  $('noted').addEventListener('change', function () { st.noted = $('noted').checked; render(); });
  function zoom(f) {
    st.zoom = Math.min(8, Math.max(0.125, st.zoom * f));
    $('zoomval').textContent = Math.round(st.zoom * 100) + '%';
    render();
  }
  $('zoomin').addEventListener('click', function () { zoom(1.25); });
  $('zoomout').addEventListener('click', function () { zoom(0.8); });
  $('ladderbox').addEventListener('wheel', function (e) {
    if (!e.ctrlKey) return;
    e.preventDefault();
    zoom(e.deltaY < 0 ? 1.1 : 0.9);
  }, { passive: false });
  $('goto').addEventListener('change', function () { select(+$('goto').value, true); });

  // shown returns the packets the filters let through.
  function shown() {
    return D.packets.filter(function (p) {
      return (st.pair === 0 || p.pair === st.pair) && st.ops.has(p.op) && (!st.noted || (p.notes && p.notes.length));
    });
  }

  // columns returns the endpoints to draw, a pair's two side by side.
  function columns(pkts) {
    var cols = [];
    var add = function (id) { if (cols.indexOf(id) < 0) cols.push(id); };
    if (st.pair !== 0) {
      var p = pairsByID.get(st.pair);
      add(p.a); add(p.b);
      return cols;
    }
    var used = new Set();
    pkts.forEach(function (p) { used.add(p.pair); });
    D.pairs.forEach(function (p) { if (used.has(p.id)) { add(p.a); add(p.b); } });
    return cols;
  }

  var ROW = 22, TOP = 16, LEFT = 150, COL = 330, HEAD = 26;

  function render() {
    var svg = $('ladder'), head = $('ladderhead');
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    while (head.firstChild) head.removeChild(head.firstChild);
    var pkts = shown();
    var cols = columns(pkts);
    var x = new Map();
    cols.forEach(function (id, i) { x.set(id, LEFT + 40 + i * COL); });
    var row = ROW * st.zoom, slant = Math.max(6, 12 * st.zoom);
    var ys = [], y = TOP + 10;
    var t0 = pkts.length ? pkts[0].t : 0;
    var span = pkts.length ? Math.max(1e-3, pkts[pkts.length - 1].t - t0) : 1;
    var scale = Math.max(pkts.length, 1) * ROW * st.zoom / span; // px per microsecond in the time layout
    pkts.forEach(function (p, i) {
      if (st.layout === 'time') y = Math.max(i ? y + 12 * st.zoom : y, TOP + 10 + (p.t - t0) * scale);
      else if (i) y += row;
      ys.push(y);
    });
    var height = (pkts.length ? ys[ys.length - 1] : TOP) + slant + 30;
    var width = LEFT + 40 + Math.max(cols.length - 1, 1) * COL + 260;
    svg.setAttribute('width', width);
    svg.setAttribute('height', height);
    svg.setAttribute('viewBox', '0 0 ' + width + ' ' + height);
    head.setAttribute('width', width);
    head.setAttribute('height', HEAD);
    head.setAttribute('viewBox', '0 0 ' + width + ' ' + HEAD);

    cols.forEach(function (id) {
      var g = el('g', { 'class': 'col' });
      g.appendChild(el('text', { x: x.get(id), y: 18, 'text-anchor': 'middle' }, D.endpoints[id].name));
      head.appendChild(g);
      g = el('g', { 'class': 'col' });
      g.appendChild(el('line', { x1: x.get(id), y1: 0, x2: x.get(id), y2: height - 10 }));
      svg.appendChild(g);
    });
    var frag = document.createDocumentFragment();
    pkts.forEach(function (p, i) {
      var y0 = ys[i], x0 = x.get(p.from), x1 = x.get(p.to);
      var cls = 'pkt';
      if (p.role === 'response') cls += ' resp';
      if (p.role === 'CNP') cls += ' cnp';
      if (p.fate) cls += ' ' + p.fate;
      var kinds = (p.notes || []).map(function (n) { return n.k; });
      if (p.role === 'request' && kinds.indexOf('retransmit') >= 0) cls += ' retx';
      if (/NAK/.test(p.label)) cls += ' nak';
      if (p.n === st.sel) cls += ' sel';
      var g = el('g', { 'class': cls, 'data-n': p.n });
      g.appendChild(el('rect', { 'class': 'hit', x: 0, y: y0 - row / 2 - 2, width: width, height: Math.max(row, 12) }));
      var dir = x1 >= x0 ? 1 : -1;
      var cut = p.fate === 'lost' || p.fate === 'dropped' || p.fate === 'corrupted';
      var xe = cut ? x0 + (x1 - x0) * 0.6 : x1, ye = cut ? y0 + slant * 0.6 : y0 + slant;
      g.appendChild(el('line', { x1: x0, y1: y0, x2: xe, y2: ye }));
      if (cut) {
        g.appendChild(el('path', { 'class': 'x', d: 'M' + (xe - 5) + ' ' + (ye - 5) + 'l10 10m0 -10l-10 10' }));
      } else {
        g.appendChild(el('path', { d: 'M' + x1 + ' ' + (y0 + slant) + 'l' + (-8 * dir) + ' -4l0 8z', 'class': 'head' }));
      }
      g.appendChild(el('text', { 'class': 't', x: 4, y: y0 + 4 }, '#' + p.n + ' ' + fmtT(p.t)));
      var lx = (x0 + x1) / 2;
      g.appendChild(el('text', { 'class': 'lbl', x: lx, y: y0 - 2, 'text-anchor': 'middle' }, p.label + (p.fate ? ' [' + p.fate + ']' : '')));
      frag.appendChild(g);
    });
    svg.appendChild(frag);
    $('shown').textContent = 'showing ' + pkts.length + ' of ' + D.packets.length + ' packets';
  }

  $('ladder').addEventListener('click', function (e) {
    var g = e.target.closest('.pkt');
    if (g) select(+g.getAttribute('data-n'), false);
  });

  // linkify writes text with every "#N" a link that selects packet N.
  function linkify(parent, text) {
    var re = /#(\d+)/g, last = 0, m;
    while ((m = re.exec(text)) !== null) {
      parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      var a = document.createElement('a');
      a.textContent = m[0];
      a.setAttribute('data-ref', m[1]);
      parent.appendChild(a);
      last = re.lastIndex;
    }
    parent.appendChild(document.createTextNode(text.slice(last)));
  }
  document.addEventListener('click', function (e) {
    var a = e.target.closest && e.target.closest('a[data-ref]');
    if (a) { e.preventDefault(); select(+a.getAttribute('data-ref'), true); }
  });

  // select shows packet n in the detail pane and marks it in the ladder.
  function select(n, scroll) {
    var p = byN.get(n);
    if (!p) return;
    if (st.pair !== 0 && p.pair !== st.pair) { st.pair = 0; $('pair').value = '0'; }
    if (!st.ops.has(p.op)) { st.ops.add(p.op); Array.prototype.forEach.call($('ops').querySelectorAll('input'), function (c) { if (c.value === p.op) c.checked = true; }); }
    st.sel = n;
    render();
    $('dtitle').textContent = 'Packet #' + n + ', ' + fmtT(p.t) + ', queue pair ' + p.pair;
    $('dline').textContent = p.line;
    var ul = $('notes');
    while (ul.firstChild) ul.removeChild(ul.firstChild);
    var refs = new Set();
    (p.notes || []).forEach(function (note) {
      var li = document.createElement('li');
      li.className = 'k-' + note.k;
      linkify(li, note.t);
      if (note.i) {
        var s = document.createElement('span');
        s.className = 'inf';
        s.textContent = 'inferred';
        li.appendChild(document.createTextNode(' '));
        li.appendChild(s);
      }
      (note.r || []).forEach(function (r) { refs.add(r); });
      ul.appendChild(li);
    });
    if (!ul.firstChild) {
      var li = document.createElement('li');
      li.textContent = 'Nothing to explain: it is what its line says.';
      ul.appendChild(li);
    }
    $('tree').textContent = p.tree.join('\n');
    refs.forEach(function (r) {
      var g = $('ladder').querySelector('.pkt[data-n="' + r + '"]');
      if (g) g.classList.add('ref');
    });
    var g = $('ladder').querySelector('.pkt[data-n="' + n + '"]');
    if (g && scroll) {
      var box = $('ladderbox');
      var bb = g.getBBox();
      if (bb.y < box.scrollTop || bb.y + bb.height + HEAD > box.scrollTop + box.clientHeight) {
        box.scrollTop = Math.max(0, bb.y - box.clientHeight / 3);
      }
      var line = g.querySelector('line').getBBox();
      if (line.x < box.scrollLeft || line.x + line.width > box.scrollLeft + box.clientWidth) {
        box.scrollLeft = Math.max(0, line.x - LEFT);
      }
    }
    if (history.replaceState) history.replaceState(null, '', '#pkt=' + n);
  }

  // The stories, the summary, the packets that are not RoCEv2, the legend.
  D.pairs.forEach(function (p) {
    var div = document.createElement('div');
    div.className = 'story';
    var h = document.createElement('h3');
    h.textContent = p.id + ': ' + p.name + ' ';
    var a = document.createElement('a');
    a.textContent = '(show its ladder)';
    a.addEventListener('click', function () { st.pair = p.id; $('pair').value = String(p.id); render(); $('ladderbox').scrollIntoView(); });
    h.appendChild(a);
    div.appendChild(h);
    var ul = document.createElement('ul');
    p.story.forEach(function (s) { var li = document.createElement('li'); linkify(li, s); ul.appendChild(li); });
    div.appendChild(ul);
    $('storylist').appendChild(div);
  });
  $('summary').textContent = D.summary;
  $('legend').textContent = D.legend;
  if (D.others && D.others.length) $('others').textContent = D.others.map(function (o) { return o.line; }).join('\n');
  else $('otherbox').style.display = 'none';

  // selftest drives the controls as a person would and writes what it saw into #selftest, for the
  // browser test (the page opened with #selftest).
  function selftest() {
    var out = [], count = function () { return $('ladder').querySelectorAll('.pkt').length; };
    var check = function (what, ok) { out.push((ok ? 'ok ' : 'FAIL ') + what); };
    var fire = function (e, type) { e.dispatchEvent(new Event(type, { bubbles: true })); };
    var all = count();
    check('ladder shows all ' + D.packets.length + ' packets', all === D.packets.length);
    var g = $('ladder').querySelectorAll('.pkt')[Math.min(1, all - 1)];
    g.querySelector('line').dispatchEvent(new MouseEvent('click', { bubbles: true }));
    var n = +g.getAttribute('data-n');
    check('click selects packet #' + n, $('dtitle').textContent.indexOf('Packet #' + n + ',') === 0 &&
      $('tree').textContent === byN.get(n).tree.join('\n'));
    var h = +$('ladder').getAttribute('height');
    $('zoomin').click();
    check('zoom in grows the ladder', +$('ladder').getAttribute('height') > h);
    $('zoomout').click();
    check('zoom out shrinks it back', Math.abs(+$('ladder').getAttribute('height') - h) < 2);
    var p1 = D.pairs[0].id;
    $('pair').value = String(p1);
    fire($('pair'), 'change');
    check('pair filter shows pair ' + p1 + ' only', count() === D.packets.filter(function (p) { return p.pair === p1; }).length);
    $('pair').value = '0';
    fire($('pair'), 'change');
    var box = $('ops').querySelector('input');
    box.checked = false;
    fire(box, 'change');
    check('opcode filter hides ' + box.value, count() === D.packets.filter(function (p) { return p.op !== box.value; }).length);
    box.checked = true;
    fire(box, 'change');
    $('layout').value = 'time';
    fire($('layout'), 'change');
    check('time layout draws every packet', count() === all);
    $('layout').value = 'seq';
    fire($('layout'), 'change');
    var pre = document.createElement('pre');
    pre.id = 'selftest';
    pre.textContent = out.join('\n');
    document.body.appendChild(pre);
  }

  render();
  if (/(?:^|[#&])selftest/.test(location.hash)) selftest();
  var m = /(?:^|[#&])pair=(\d+)/.exec(location.hash);
  if (m && pairsByID.has(+m[1])) { st.pair = +m[1]; $('pair').value = m[1]; render(); }
  m = /(?:^|[#&])pkt=(\d+)/.exec(location.hash);
  if (m) select(+m[1], true);
})();
