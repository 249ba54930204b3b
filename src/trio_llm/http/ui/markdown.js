// A small Markdown renderer for model replies.
//
// Safe by construction: it builds DOM nodes and only ever sets text (createTextNode,
// textContent), and an href only when the URL is http(s) or mailto, so a reply cannot add
// markup, scripts, styles or handlers. Nothing here or in chat.js assigns innerHTML, and the
// page's Content-Security-Policy would refuse inline script even if something did.
//
// It covers what chat models write: fenced code blocks (rendered while still open, as they
// stream), headings, lists nested by indentation, block quotes, rules, paragraphs whose single
// newlines are kept, inline code, **bold**, *italic*, ~~strike~~, [links](url), bare URLs and
// backslash escapes. Everything else stays plain text.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const ITEM = /^([ \t]*)([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
const QUOTE = /^ {0,3}>[ \t]?(.*)$/;

const INLINE = new RegExp(
  [
    /\\([!-/:-@[-`{-~])/.source, // 1: an escaped punctuation character
    /(`+)([^`]|[^`][\s\S]*?[^`])\2(?!`)/.source, // 2, 3: code span
    /\[([^\]\n]+)\]\(\s*<?([^\s<>()]+)>?(?:\s+"[^"\n]*")?\s*\)/.source, // 4, 5: link
    /\*\*(?=\S)([\s\S]*?\S)\*\*/.source, // 6: bold
    /(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/.source, // 7: bold
    /\*(?=[^\s*])((?:[^*]|\*\*[^*]+\*\*)*?[^\s*])\*(?!\*)/.source, // 8: italic
    /(?<!\w)_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/.source, // 9: italic
    /~~(?=\S)([\s\S]*?\S)~~/.source, // 10: strikethrough
    /\bhttps?:\/\/[^\s<>"'`]*[^\s<>"'`.,;:!?)\]]/.source, // bare URL (the whole match)
  ].join("|"),
  "g",
);

/** The Markdown `text` as a DocumentFragment of plain elements and text nodes. */
export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let paragraph = null; // the <p> or <blockquote> that text lines are appended to
  let quote = null;
  let lists = []; // the open lists, innermost last: {element, indent, ordered}
  let afterBlank = false;

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      paragraph = quote = null;
      afterBlank = true;
      continue;
    }
    const blank = afterBlank;
    afterBlank = false;

    if ((m = FENCE.exec(line))) {
      const body = [];
      const fence = m[1];
      for (i++; i < lines.length && !closesFence(lines[i], fence); i++) body.push(lines[i]);
      (lists.length ? lastItem(lists) : root).append(codeBlock(body.join("\n"), m[2]));
      paragraph = quote = null;
      continue;
    }
    if (RULE.test(line)) {
      root.append(document.createElement("hr"));
      paragraph = quote = null;
      lists = [];
      continue;
    }
    if ((m = HEADING.exec(line))) {
      const heading = document.createElement(`h${m[1].length}`);
      heading.append(inline(m[2]));
      root.append(heading);
      paragraph = quote = null;
      lists = [];
      continue;
    }
    if ((m = ITEM.exec(line))) {
      addItem(root, lists, indentOf(m[1]), m[2], m[3]);
      paragraph = quote = null;
      continue;
    }
    if ((m = QUOTE.exec(line))) {
      if (!quote) {
        quote = document.createElement("blockquote");
        root.append(quote);
      } else {
        quote.append(document.createElement("br"));
      }
      quote.append(inline(m[1]));
      paragraph = null;
      lists = [];
      continue;
    }
    if (lists.length && (!blank || /^[ \t]/.test(line))) {
      // A continuation of the last item (indented, or lazily right after it).
      const item = lastItem(lists);
      item.append(document.createElement("br"), inline(line.trim()));
      continue;
    }
    lists = [];
    quote = null;
    if (!paragraph) {
      paragraph = document.createElement("p");
      root.append(paragraph);
    } else {
      paragraph.append(document.createElement("br"));
    }
    paragraph.append(inline(line));
  }
  return root;
}

function closesFence(line, fence) {
  const trimmed = line.trim();
  return trimmed.length >= fence.length && trimmed === fence[0].repeat(trimmed.length);
}

function codeBlock(text, language) {
  const pre = document.createElement("pre");
  const code = document.createElement("code");
  if (/^[\w+#.-]{1,32}$/.test(language)) code.className = `language-${language}`;
  code.textContent = text;
  pre.append(code);
  return pre;
}

function indentOf(whitespace) {
  return whitespace.replace(/\t/g, "    ").length;
}

function lastItem(lists) {
  return lists[lists.length - 1].element.lastElementChild;
}

function addItem(root, lists, indent, marker, text) {
  const ordered = /\d/.test(marker[0]);
  while (lists.length && lists[lists.length - 1].indent > indent) lists.pop();
  let top = lists[lists.length - 1];
  if (top && top.indent === indent && top.ordered !== ordered) {
    lists.pop();
    top = lists[lists.length - 1];
  }
  if (!top || top.indent < indent) {
    const element = document.createElement(ordered ? "ol" : "ul");
    if (ordered && parseInt(marker, 10) !== 1) element.start = parseInt(marker, 10);
    (top ? top.element.lastElementChild : root).append(element);
    top = { element, indent, ordered };
    lists.push(top);
  }
  const item = document.createElement("li");
  item.append(inline(text));
  top.element.append(item);
}

/** Inline Markdown in `text` as a fragment. */
export function inline(text) {
  const fragment = document.createDocumentFragment();
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) fragment.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[1] !== undefined) {
      fragment.append(m[1]);
    } else if (m[3] !== undefined) {
      const code = document.createElement("code");
      code.textContent = m[3].length > 2 && /^ .* $/.test(m[3]) ? m[3].slice(1, -1) : m[3];
      fragment.append(code);
    } else if (m[4] !== undefined) {
      fragment.append(link(m[5], inline(m[4])));
    } else if (m[6] !== undefined || m[7] !== undefined) {
      fragment.append(wrap("strong", m[6] ?? m[7]));
    } else if (m[8] !== undefined || m[9] !== undefined) {
      fragment.append(wrap("em", m[8] ?? m[9]));
    } else if (m[10] !== undefined) {
      fragment.append(wrap("del", m[10]));
    } else {
      fragment.append(link(m[0], document.createTextNode(m[0])));
    }
  }
  if (last < text.length) fragment.append(text.slice(last));
  return fragment;
}

function wrap(tag, text) {
  const element = document.createElement(tag);
  element.append(inline(text));
  return element;
}

/** A link to `href` when it is http(s) or mailto; anything else (javascript:, data:, ...)
 * becomes its text alone. */
function link(href, content) {
  let url;
  try {
    url = new URL(href, document.baseURI);
  } catch {
    return content;
  }
  if (!["http:", "https:", "mailto:"].includes(url.protocol)) return content;
  const a = document.createElement("a");
  a.href = url.href;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  a.append(content);
  return a;
}
