(function(){
  var table=document.getElementById('cohort'), body=table.tBodies[0];
  table.querySelectorAll('th[data-type]').forEach(function(th){
    th.addEventListener('click',function(){
      var col=th.cellIndex, num=th.dataset.type==='num', dir=th.dataset.dir==='asc'?-1:1;
      table.querySelectorAll('th').forEach(function(o){delete o.dataset.dir;});
      th.dataset.dir=dir>0?'asc':'desc';
      function key(r){var v=r.cells[col].dataset.v;return num?parseFloat(v):v;}
      Array.from(body.rows).sort(function(a,b){
        var x=key(a),y=key(b);
        if(num){if(isNaN(x))return isNaN(y)?0:1;if(isNaN(y))return -1;}
        return dir*(x<y?-1:x>y?1:0);
      }).forEach(function(r){body.appendChild(r);});
    });
  });
  var button=document.getElementById('only-review');
  button.addEventListener('click',function(){
    var on=document.body.classList.toggle('only-review');
    button.textContent=on?'Show all scans':'Show only scans that need review';
  });
})();
