"""Deterministic text samples per category, made without any network.

Used to calibrate and check the token estimator of
``async_context_compression.py`` (``estimate_text_tokens``) and by the
benchmark to build realistic chats. Every sample comes from hand-written
seed text (the CJK paragraphs were written for this corpus) recombined with
``random.Random(seed)``: the same seed always gives the same samples.

    from bench.corpus import corpus, CATEGORIES
    for category, samples in corpus(per_category=300).items(): ...

Lengths are spread log-uniformly from 10 to 20,000 characters.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import string
import uuid
from collections.abc import Callable
from functools import lru_cache

CATEGORIES = ("english", "chinese", "japanese", "korean", "code", "json", "tool_output", "mixed", "other_languages")
MIN_CHARS, MAX_CHARS = 10, 20_000

# ---------------------------------------------------------------------------
# Seed text
# ---------------------------------------------------------------------------

ENGLISH = [
    "The migration finished overnight, but three of the reporting jobs still read from the old schema.",
    "Could you check whether the invoice totals match the numbers in last quarter's spreadsheet?",
    "We moved the meeting to Thursday at 2:30 pm because half of the team is travelling on Wednesday.",
    "In the first experiment, the model's accuracy dropped from 91.4% to 87.2% once we removed the augmented data.",
    "Honestly, I think the simplest fix is to cache the results and invalidate them whenever the config changes.",
    "The river had risen nearly two metres after the storm, and the old footbridge was closed until further notice.",
    "She spent the afternoon rewriting the introduction, which now explains the problem before proposing a solution.",
    "If the request times out, retry it with exponential back-off, but give up after five attempts.",
    "Our customers in Brazil and Portugal asked for invoices in their own language, so localisation moved up the roadmap.",
    "The library's documentation is thorough, although a few of the examples no longer compile with the latest release.",
    "Please summarize the main arguments of the paper in plain language, without the jargon.",
    "A good recipe for bread needs only flour, water, salt and yeast; patience does the rest.",
    "The quarterly report shows revenue of $4.2 million, up 12 percent year over year, while costs stayed flat.",
    "When I ran the script again with verbose logging, the error disappeared, which usually means a race condition.",
    "Tomorrow's forecast calls for light rain in the morning and clearing skies by the late afternoon.",
    "He argued that the committee's decision ignored the long-term maintenance costs of the new building.",
    "Let's keep the public API stable and mark the old function as deprecated for one more release.",
    "The museum reopened in May with a new wing devoted to nineteenth-century photography.",
    "I'm not sure the benchmark is fair: the baseline was compiled without optimizations.",
    "To reproduce the bug, open two browser tabs, edit the same document in both, and save them within a second.",
    "Most of the delay comes from the database, not the network, according to the traces we collected yesterday.",
    "The children built a small weather station in the schoolyard and record the temperature every morning.",
    "Could you rewrite this paragraph so that it sounds less formal but keeps every technical detail?",
    "After reviewing the contract, our lawyer suggested adding a clause about data retention and deletion.",
    "Version 2.3 fixes the memory leak in the image decoder and adds support for animated WebP files.",
    "Nobody expected the small startup to win the tender, yet its proposal was the cheapest and the clearest.",
    "The hiking trail climbs steadily for six kilometres before reaching a ridge with views of three valleys.",
    "What's the difference between a process and a thread, and when should I prefer one over the other?",
    "Our on-call engineer was paged at 3 a.m. because the disk on the primary replica filled up.",
    "The novel follows two sisters who inherit a failing vineyard and try to save it in a single summer.",
    "Remember to rotate the API keys before the audit; the current ones were created more than a year ago.",
    "In practice, the theoretical speed-up rarely materialises, because memory bandwidth becomes the bottleneck.",
    "The conference accepted our talk, so we need slides, a demo, and a backup video in case the Wi-Fi fails.",
    "I compared the two drafts line by line and marked every sentence where the meaning changed.",
    "Interest rates are expected to stay unchanged until the inflation figures for the autumn are published.",
    "The volunteers planted more than 1,200 trees along the riverbank during the spring weekend.",
    "Thanks for the quick reply! One more question: does the discount also apply to annual plans?",
    "The compiler warns about an unused variable, but the real problem is the missing return statement below it.",
    "She translated the user manual into French and German, then asked native speakers to proofread it.",
    "Because the sensor drifts with temperature, we calibrate it twice a day against a reference thermometer.",
]

CHINESE = [
    "昨天晚上的系统升级基本顺利，但是有三个报表任务仍然读取旧的数据表，需要今天上午尽快修改。",
    "请帮我检查一下上个季度的发票总额是否和表格里的数字一致，如果有出入，请把差异列出来。",
    "因为一半的同事周三要出差，我们把例会改到了周四下午两点半，地点还是三楼的会议室。",
    "在第一组实验中，去掉数据增强以后，模型的准确率从百分之九十一点四下降到了百分之八十七点二。",
    "说实话，我觉得最简单的办法是把结果缓存起来，每当配置发生变化时再让缓存失效。",
    "暴雨过后，河水上涨了将近两米，那座老旧的人行桥已经封闭，何时重新开放还没有通知。",
    "她花了整个下午重写引言部分，现在文章先说明问题的来龙去脉，然后才提出解决方案。",
    "如果请求超时，就按照指数退避的方式重试，但是最多尝试五次，之后应当放弃并记录错误。",
    "巴西和葡萄牙的客户希望收到用本国语言开具的发票，所以本地化工作在路线图上的优先级提高了。",
    "这个库的文档写得很详细，不过其中几个示例已经无法在最新版本上编译通过了。",
    "请用通俗易懂的语言概括这篇论文的主要论点，尽量不要使用专业术语。",
    "做面包其实只需要面粉、水、盐和酵母，剩下的就交给时间和耐心吧。",
    "季度报告显示营业收入为四百二十万元，同比增长百分之十二，而成本基本保持不变。",
    "我打开详细日志又运行了一遍脚本，错误竟然消失了，这通常意味着存在竞争条件。",
    "天气预报说明天上午有小雨，到了傍晚天空会逐渐放晴，气温在十五到二十二度之间。",
    "他认为委员会的决定忽视了新大楼长期的维护成本，这个问题迟早会暴露出来。",
    "我们应该保持公共接口稳定，把旧函数标记为已弃用，再保留一个版本的过渡期。",
    "博物馆在五月重新开放，新增了一个专门展示十九世纪摄影作品的展厅。",
    "我不确定这个基准测试是否公平，因为对照组在编译时没有开启任何优化选项。",
    "要复现这个问题，需要在两个浏览器标签页中同时编辑同一份文档，并在一秒钟内先后保存。",
    "根据昨天收集到的链路追踪数据，大部分延迟来自数据库，而不是网络传输。",
    "孩子们在校园里搭建了一个小小的气象站，每天早上都会记录当天的气温和湿度。",
    "合同审阅完之后，律师建议我们增加一条关于数据保存期限和删除方式的条款。",
    "二点三版本修复了图像解码器的内存泄漏问题，并且新增了对动态图片格式的支持。",
    "谁也没想到这家小小的创业公司会中标，可它的方案既是报价最低的，也是写得最清楚的。",
    "这条徒步路线要连续爬升六公里，才能到达山脊，站在那里可以同时看到三条山谷。",
    "进程和线程到底有什么区别？在什么情况下应该优先选择其中一种？",
    "凌晨三点，值班工程师被告警叫醒，原因是主副本所在的磁盘空间已经写满了。",
    "小说讲述了两姐妹继承了一座经营不善的葡萄园，并试图在一个夏天之内让它起死回生的故事。",
    "审计之前记得轮换接口密钥，现在使用的这些密钥已经创建一年多了。",
    "在实际应用中，理论上的加速效果很少能够完全实现，因为内存带宽往往会成为瓶颈。",
    "谢谢你这么快回复！还有一个问题：这个折扣是否同样适用于按年付费的套餐？",
    "编译器提示有一个未使用的变量，但真正的问题是下面缺少了一条返回语句。",
    "由于传感器的读数会随温度漂移，我们每天用标准温度计对它校准两次。",
    "春天的那个周末，志愿者们沿着河岸种下了一千二百多棵树苗。",
    "中秋节快到了，超市里的月饼礼盒琳琅满目，价格从几十元到上千元不等。",
    "这家老字号饭馆的招牌菜是红烧肉，肥而不腻，入口即化，很多人专程开车过来品尝。",
    "他每天坚持早起跑步，半年下来体重减轻了八公斤，精神状态也比以前好多了。",
    "如果你对这个方案还有疑问，欢迎随时在群里提出来，我们下周一再一起讨论。",
    "长江是中国第一大河，全长约六千三百公里，流经十一个省、自治区和直辖市。",
]

JAPANESE = [
    "昨夜のシステム移行はほぼ予定どおりに終わりましたが、三つの集計ジョブがまだ古いテーブルを参照しています。",
    "前四半期の請求書の合計がスプレッドシートの数字と一致しているか、確認していただけますか。",
    "水曜日はチームの半数が出張するため、定例会議を木曜日の午後二時半に変更しました。",
    "最初の実験では、拡張データを取り除いたところ、モデルの精度が九一・四パーセントから八七・二パーセントに下がりました。",
    "正直なところ、結果をキャッシュして設定が変わるたびに無効化するのが一番簡単な方法だと思います。",
    "嵐のあと川の水位が二メートル近く上がり、古い歩道橋は当面のあいだ通行止めになっています。",
    "彼女は午後いっぱいをかけて序論を書き直し、解決策を示す前に問題の背景を説明する構成にしました。",
    "リクエストがタイムアウトした場合は指数バックオフで再試行し、五回失敗したらあきらめてください。",
    "このライブラリのドキュメントはとても丁寧ですが、いくつかのサンプルは最新版ではもうコンパイルできません。",
    "論文の主な主張を、専門用語を使わずにわかりやすい言葉で要約してください。",
    "おいしいパンに必要なのは小麦粉と水と塩とイーストだけで、あとは時間が仕上げてくれます。",
    "詳細なログを有効にしてスクリプトをもう一度実行すると、エラーが消えてしまいました。競合状態の可能性が高いです。",
    "明日の天気予報では、午前中は小雨が降りますが、夕方には晴れ間が広がる見込みです。",
    "公開されているインターフェースは変えずに、古い関数は非推奨としてもう一つのリリースまで残しましょう。",
    "美術館は五月に再開し、十九世紀の写真作品を集めた新しい展示室が加わりました。",
    "不具合を再現するには、二つのタブで同じ文書を編集し、一秒以内に両方を保存してください。",
    "昨日取得したトレースによると、遅延の大部分はネットワークではなくデータベースで発生しています。",
    "子どもたちは校庭に小さな気象観測所を作り、毎朝気温と湿度を記録しています。",
    "契約書を確認した弁護士から、データの保存期間と削除に関する条項を追加するよう助言がありました。",
    "小さなスタートアップが入札に勝つとは誰も思っていませんでしたが、その提案は最も安く、最もわかりやすいものでした。",
    "このハイキングコースは六キロほど登り続けると尾根に出て、三つの谷を一度に見渡せます。",
    "プロセスとスレッドの違いは何ですか。また、どちらを選ぶべきかはどのように判断すればよいでしょうか。",
    "午前三時に当番のエンジニアが呼び出されました。プライマリのディスクが満杯になったのが原因です。",
    "監査の前にAPIキーを更新するのを忘れないでください。今のキーは一年以上前に作られたものです。",
    "すぐにお返事をいただきありがとうございます。もう一つ質問ですが、年間プランにも割引は適用されますか。",
    "コンパイラは未使用の変数について警告していますが、本当の問題はその下にある戻り値の欠落です。",
    "センサーの値は温度によってずれるので、一日に二回、基準となる温度計で校正しています。",
    "春の週末に、ボランティアの人たちが川沿いに千二百本以上の苗木を植えました。",
    "京都の紅葉は十一月の下旬が見ごろで、早朝に出かければ人混みを避けてゆっくり散策できます。",
    "駅前の喫茶店では、昔ながらのナポリタンと分厚いホットケーキが今でも人気メニューです。",
    "来週の金曜日までに見積書を送っていただけると、社内の稟議に間に合うので助かります。",
    "ひらがなとカタカナを覚えたら、次は日常でよく使う漢字から少しずつ練習するとよいでしょう。",
    "新幹線が遅れたため、大阪での打ち合わせには三十分ほど遅れて到着しました。",
    "このアプリは通知が多すぎるので、設定画面から必要なものだけを残すようにしました。",
]

KOREAN = [
    "어젯밤 시스템 이전 작업은 거의 예정대로 끝났지만, 보고서 작업 세 개가 아직 예전 테이블을 읽고 있습니다.",
    "지난 분기 청구서 합계가 스프레드시트의 숫자와 맞는지 한번 확인해 주시겠어요?",
    "수요일에는 팀원 절반이 출장을 가기 때문에 정기 회의를 목요일 오후 두 시 반으로 옮겼습니다.",
    "첫 번째 실험에서 증강 데이터를 빼자 모델의 정확도가 91.4퍼센트에서 87.2퍼센트로 떨어졌습니다.",
    "솔직히 가장 간단한 방법은 결과를 캐시해 두었다가 설정이 바뀔 때마다 무효화하는 것이라고 생각해요.",
    "폭우가 지나간 뒤 강물이 2미터 가까이 불어나서 오래된 보행교는 별도 안내가 있을 때까지 통제되었습니다.",
    "그녀는 오후 내내 서론을 다시 썼고, 이제 글은 해결책을 제시하기 전에 문제의 배경부터 설명합니다.",
    "요청 시간이 초과되면 지수 백오프 방식으로 다시 시도하되, 다섯 번 실패하면 포기하고 오류를 기록하세요.",
    "브라질과 포르투갈의 고객들이 자국어로 된 청구서를 요청해서 현지화 작업의 우선순위가 올라갔습니다.",
    "이 라이브러리의 문서는 아주 자세하지만, 몇몇 예제는 최신 버전에서 더 이상 컴파일되지 않습니다.",
    "이 논문의 핵심 주장을 전문 용어 없이 쉬운 말로 요약해 주세요.",
    "맛있는 빵을 만드는 데 필요한 것은 밀가루와 물, 소금, 효모뿐이고 나머지는 시간이 해결해 줍니다.",
    "자세한 로그를 켜고 스크립트를 다시 실행했더니 오류가 사라졌는데, 이런 경우는 대개 경쟁 상태 때문입니다.",
    "내일은 오전에 약한 비가 내리다가 늦은 오후부터 차차 맑아질 것으로 예보되었습니다.",
    "그는 위원회의 결정이 새 건물의 장기적인 유지 보수 비용을 고려하지 않았다고 주장했습니다.",
    "공개 인터페이스는 그대로 두고, 예전 함수는 사용 중단으로 표시한 뒤 한 번의 릴리스 동안 더 유지합시다.",
    "박물관은 5월에 다시 문을 열었고, 19세기 사진 작품을 모은 새 전시관이 생겼습니다.",
    "문제를 재현하려면 두 개의 탭에서 같은 문서를 편집하고 1초 안에 둘 다 저장해 보세요.",
    "어제 수집한 추적 데이터를 보면 지연의 대부분은 네트워크가 아니라 데이터베이스에서 발생합니다.",
    "아이들은 운동장에 작은 기상 관측소를 만들고 매일 아침 기온과 습도를 기록합니다.",
    "계약서를 검토한 변호사는 데이터 보관 기간과 삭제 방법에 관한 조항을 추가하라고 조언했습니다.",
    "작은 스타트업이 입찰에서 이길 줄은 아무도 몰랐지만, 그 제안서는 가장 저렴하고 가장 명확했습니다.",
    "이 등산로는 6킬로미터 정도 꾸준히 오르막이 이어지다가 세 개의 계곡이 한눈에 보이는 능선에 닿습니다.",
    "프로세스와 스레드의 차이는 무엇이고, 어떤 경우에 어느 쪽을 선택해야 하나요?",
    "새벽 세 시에 당직 엔지니어가 호출을 받았는데, 주 복제본의 디스크가 가득 찼기 때문이었습니다.",
    "감사 전에 API 키를 꼭 교체해 주세요. 지금 쓰는 키는 만든 지 1년이 넘었습니다.",
    "빠른 답변 감사합니다! 질문이 하나 더 있는데요, 연간 요금제에도 할인이 적용되나요?",
    "컴파일러는 사용하지 않는 변수에 대해 경고하지만, 진짜 문제는 그 아래에 빠진 반환문입니다.",
    "센서 값이 온도에 따라 달라지기 때문에 하루에 두 번 기준 온도계로 보정하고 있습니다.",
    "봄철 주말에 자원봉사자들이 강둑을 따라 1,200그루가 넘는 나무를 심었습니다.",
    "가을이 되면 설악산의 단풍을 보러 전국에서 많은 사람이 찾아와 주말마다 길이 막힙니다.",
    "저녁으로는 김치찌개와 계란말이를 만들었는데, 오랜만에 집밥을 먹으니 정말 든든했어요.",
    "다음 주 금요일까지 견적서를 보내 주시면 내부 결재 일정에 맞출 수 있을 것 같습니다.",
    "한글은 자음과 모음을 조합해 글자를 만들기 때문에 처음 배우는 사람도 비교적 빨리 읽을 수 있습니다.",
]

# Other languages and scripts, so the estimator is measured beyond English
# and CJK: European and other Latin-script languages (which need more tokens
# per letter than English), Cyrillic, Greek, Arabic, Hebrew, Devanagari,
# Thai, Vietnamese, emoji.
OTHER_LANGUAGES = {
    "russian": [
        "Миграция завершилась ночью, но три отчёта всё ещё читают данные из старой схемы.",
        "Не могли бы вы проверить, совпадают ли суммы счетов с цифрами в таблице за прошлый квартал?",
        "Если запрос не отвечает, повторите его с экспоненциальной задержкой, но не более пяти раз.",
        "Библиотека хорошо документирована, хотя некоторые примеры уже не собираются с последней версией.",
        "Завтра утром ожидается небольшой дождь, а к вечеру небо прояснится и станет заметно теплее.",
        "Музей снова открылся в мае, и теперь в нём есть новое крыло, посвящённое фотографии девятнадцатого века.",
        "Чтобы воспроизвести ошибку, откройте документ в двух вкладках и сохраните оба варианта в течение секунды.",
        "По данным трассировки, большая часть задержки приходится на базу данных, а не на сеть.",
        "Дети построили во дворе школы маленькую метеостанцию и каждое утро записывают температуру.",
        "Спасибо за быстрый ответ! Ещё один вопрос: распространяется ли скидка на годовые тарифы?",
        "Компилятор предупреждает о неиспользуемой переменной, но настоящая проблема в пропущенном операторе возврата.",
        "Перед аудитом не забудьте заменить ключи доступа: нынешние были созданы больше года назад.",
    ],
    "greek": [
        "Η συνάντηση μεταφέρθηκε την Πέμπτη στις δύο και μισή, γιατί οι μισοί συνάδελφοι ταξιδεύουν.",
        "Το μουσείο άνοιξε ξανά τον Μάιο με μια νέα πτέρυγα αφιερωμένη στη φωτογραφία του δέκατου ένατου αιώνα.",
    ],
    "arabic": [
        "انتهت عملية الترحيل خلال الليل، لكن ثلاثة تقارير ما زالت تقرأ من الجدول القديم.",
        "هل يمكنك التحقق من أن مجموع الفواتير يطابق الأرقام الموجودة في جدول الربع الماضي؟",
    ],
    "hebrew": [
        "הפגישה נדחתה ליום חמישי בשתיים וחצי, כי חצי מהצוות נמצא בנסיעה.",
    ],
    "hindi": [
        "कल रात सिस्टम का स्थानांतरण लगभग समय पर पूरा हो गया, लेकिन तीन रिपोर्ट अब भी पुरानी तालिका पढ़ रही हैं।",
        "कृपया इस शोध पत्र के मुख्य तर्कों को सरल भाषा में, बिना तकनीकी शब्दों के, संक्षेप में बताइए।",
    ],
    "thai": [
        "การย้ายระบบเมื่อคืนเสร็จเกือบตรงตามกำหนด แต่รายงานสามรายการยังอ่านข้อมูลจากตารางเก่าอยู่",
        "พรุ่งนี้ช่วงเช้าจะมีฝนตกเล็กน้อย และท้องฟ้าจะแจ่มใสขึ้นในช่วงบ่ายแก่ๆ",
    ],
    "vietnamese": [
        "Việc chuyển hệ thống tối qua gần như đúng kế hoạch, nhưng ba báo cáo vẫn đọc dữ liệu từ bảng cũ.",
        "Bạn có thể kiểm tra xem tổng số tiền trên hóa đơn có khớp với số liệu trong bảng tính quý trước không?",
        "Bảo tàng mở cửa trở lại vào tháng Năm với một khu trưng bày mới dành cho nhiếp ảnh thế kỷ mười chín.",
        "Cảm ơn bạn đã trả lời nhanh! Còn một câu hỏi nữa: ưu đãi này có áp dụng cho gói trả theo năm không?",
    ],
    "german": [
        "Die Straßenbahn fährt über die Brücke, während die Kinder im Café Äpfel und Brötchen essen.",
        "Könnten Sie prüfen, ob die Rechnungsbeträge mit den Zahlen der Tabelle übereinstimmen?",
        "Die Migration wurde über Nacht abgeschlossen, aber drei Berichte lesen noch aus der alten Tabelle.",
        "Wenn die Anfrage zu lange dauert, wiederhole sie mit exponentiellem Backoff, aber gib nach fünf Versuchen auf.",
        "Die Kinder haben auf dem Schulhof eine kleine Wetterstation gebaut und messen jeden Morgen die Temperatur.",
        "Danke für die schnelle Antwort! Noch eine Frage: Gilt der Rabatt auch für Jahresabonnements?",
    ],
    "french": [
        "Le musée a rouvert en mai avec une nouvelle aile consacrée à la photographie du dix-neuvième siècle.",
        "Après avoir relu le contrat, notre avocate a suggéré d'ajouter une clause sur la conservation des données.",
        "La migration s'est terminée pendant la nuit, mais trois rapports lisent encore l'ancienne table.",
        "Pourriez-vous vérifier si les totaux des factures correspondent aux chiffres du tableur du trimestre dernier ?",
        "Si la requête expire, relancez-la avec un délai exponentiel, mais abandonnez après cinq tentatives.",
        "Merci pour votre réponse rapide ! Encore une question : la remise s'applique-t-elle aussi aux forfaits annuels ?",
    ],
    "spanish": [
        "¿Podrías resumir los argumentos principales del artículo en un lenguaje sencillo, sin jerga técnica?",
        "La migración terminó durante la noche, pero tres informes todavía leen del esquema antiguo.",
        "¿Podrías comprobar si los totales de las facturas coinciden con las cifras de la hoja de cálculo del trimestre pasado?",
        "Si la solicitud tarda demasiado, vuelve a intentarlo con una espera exponencial, pero abandona después de cinco intentos.",
        "Mañana por la mañana habrá lluvias ligeras y por la tarde el cielo se irá despejando poco a poco.",
    ],
    "turkish": [
        "Göç işlemi gece tamamlandı, ancak üç rapor hâlâ eski tablodan okuma yapıyor.",
        "Geçen çeyreğin tablosundaki rakamlarla fatura toplamlarının eşleşip eşleşmediğini kontrol eder misiniz?",
        "Çocuklar okul bahçesinde küçük bir hava istasyonu kurdular ve her sabah sıcaklığı kaydediyorlar.",
        "Hızlı cevabınız için teşekkürler! Bir sorum daha var: indirim yıllık planlar için de geçerli mi?",
    ],
    "emoji": [
        "Great job on the release 🎉🚀 — the dashboard looks amazing 😍👍 and the tests are green ✅🔥",
        "Weekend plans: 🏔️ hiking, 🍕 pizza, 🎬 a movie, and finally 😴 sleep. Who's in? 🙋\u200d♀️🙋\u200d♂️",
        "🎂🎈🎁 Happy birthday!!! 🥳🥳🥳 Have the best day 💖✨",
        "😂😂😂 no way 🤣 that's hilarious 👏👏 😭",
        "Reactions: 👍 12 · ❤️ 8 · 😮 3 · 😢 1 · 🙏 5 · 👨\u200d👩\u200d👧\u200d👦 family · 👋🏽 hi · 🇯🇵🇫🇷🇧🇷 flags",
        "☕️🥐 breakfast → 💻 work → 🏃\u200d♂️ run → 🍜 dinner → 📚 read → 😴",
    ],
    "portuguese": [
        "A migração terminou durante a noite, mas três relatórios ainda leem a tabela antiga.",
        "Você poderia verificar se os totais das faturas batem com os números da planilha do último trimestre?",
        "O museu reabriu em maio com uma nova ala dedicada à fotografia do século dezenove.",
        "Obrigado pela resposta rápida! Mais uma pergunta: o desconto também vale para os planos anuais?",
    ],
    "italian": [
        "La migrazione è terminata durante la notte, ma tre report leggono ancora dalla vecchia tabella.",
        "Potresti controllare se i totali delle fatture corrispondono ai numeri del foglio di calcolo dello scorso trimestre?",
        "Per riprodurre il problema, apri lo stesso documento in due schede e salvalo in entrambe entro un secondo.",
        "I bambini hanno costruito una piccola stazione meteo nel cortile della scuola e misurano la temperatura ogni mattina.",
    ],
    "dutch": [
        "De migratie is vannacht afgerond, maar drie rapporten lezen nog steeds uit de oude tabel.",
        "Kun je controleren of de factuurbedragen overeenkomen met de cijfers in de spreadsheet van vorig kwartaal?",
        "Volgens de traces van gisteren komt de meeste vertraging van de database en niet van het netwerk.",
        "Bedankt voor je snelle antwoord! Nog één vraag: geldt de korting ook voor jaarabonnementen?",
    ],
    "polish": [
        "Migracja zakończyła się w nocy, ale trzy raporty nadal czytają dane ze starej tabeli.",
        "Czy możesz sprawdzić, czy sumy faktur zgadzają się z liczbami w arkuszu z poprzedniego kwartału?",
        "Jeśli żądanie przekroczy limit czasu, ponów je z wykładniczym opóźnieniem, ale zrezygnuj po pięciu próbach.",
        "Dzieci zbudowały na szkolnym podwórku małą stację pogodową i codziennie rano zapisują temperaturę.",
    ],
    "indonesian": [
        "Migrasi selesai semalam, tetapi tiga laporan masih membaca data dari tabel lama.",
        "Bisakah kamu memeriksa apakah total tagihan sesuai dengan angka di lembar kerja kuartal lalu?",
        "Jika permintaan melebihi batas waktu, ulangi dengan jeda eksponensial, tetapi hentikan setelah lima kali percobaan.",
        "Terima kasih atas jawaban yang cepat! Satu pertanyaan lagi: apakah diskon ini juga berlaku untuk paket tahunan?",
    ],
    "ukrainian": [
        "Міграція завершилася вночі, але три звіти досі читають дані зі старої схеми.",
        "Чи не могли б ви перевірити, чи збігаються суми рахунків із цифрами в таблиці за минулий квартал?",
        "Діти збудували на шкільному подвір'ї маленьку метеостанцію і щоранку записують температуру.",
        "Дякую за швидку відповідь! Ще одне питання: чи діє знижка також на річні тарифи?",
    ],
}

CODE_SNIPPETS = [
    '''def load_config(path: str) -> dict:
    """Read a YAML file and merge it over the defaults."""
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    merged = {**DEFAULTS, **data}
    if merged["workers"] < 1:
        raise ValueError(f"workers must be positive, got {merged['workers']}")
    return merged
''',
    """class LRUCache:
    def __init__(self, capacity: int = 128):
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key, default=None):
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
""",
    """async function fetchUser(id) {
  const response = await fetch(`/api/users/${id}`, {
    headers: { Authorization: `Bearer ${token}` },
  });
  if (!response.ok) {
    throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  }
  return response.json();
}
""",
    """SELECT c.id, c.name, SUM(o.total) AS revenue
FROM customers AS c
JOIN orders AS o ON o.customer_id = c.id
WHERE o.created_at >= DATE '2024-01-01'
  AND o.status IN ('paid', 'shipped')
GROUP BY c.id, c.name
HAVING SUM(o.total) > 1000
ORDER BY revenue DESC
LIMIT 20;
""",
    """func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.db.PingContext(ctx); err != nil {
		http.Error(w, "database unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
}
""",
    """#!/usr/bin/env bash
set -euo pipefail
for file in "$@"; do
  if [[ ! -f "$file" ]]; then
    echo "skipping $file: not a regular file" >&2
    continue
  fi
  sha256sum "$file" >> checksums.txt
done
tar -czf "backup-$(date +%Y%m%d).tar.gz" "$@"
""",
    """impl Iterator for Fibonacci {
    type Item = u64;

    fn next(&mut self) -> Option<Self::Item> {
        let current = self.a;
        self.a = self.b;
        self.b = current.checked_add(self.b)?;
        Some(current)
    }
}
""",
    """<div class="card">
  <img src="/static/avatar.png" alt="User avatar" width="64" height="64">
  <div class="card-body">
    <h2 class="card-title">{{ user.name }}</h2>
    <p class="card-text">{{ user.bio | truncate(120) }}</p>
    <a href="/users/{{ user.id }}" class="btn btn-primary">Profile</a>
  </div>
</div>
""",
    """.sidebar {
  position: sticky;
  top: 0;
  display: flex;
  flex-direction: column;
  gap: 0.75rem;
  max-height: calc(100vh - 4rem);
  overflow-y: auto;
}
@media (max-width: 768px) {
  .sidebar { position: static; max-height: none; }
}
""",
    """import numpy as np

def moving_average(values, window=5):
    kernel = np.ones(window) / window
    padded = np.pad(values, (window // 2, window - 1 - window // 2), mode="edge")
    return np.convolve(padded, kernel, mode="valid")

print(moving_average(np.arange(10, dtype=float), window=3))
""",
    """public final class RetryPolicy {
    private final int maxAttempts;
    private final Duration baseDelay;

    public RetryPolicy(int maxAttempts, Duration baseDelay) {
        this.maxAttempts = maxAttempts;
        this.baseDelay = Objects.requireNonNull(baseDelay);
    }

    public Duration delayFor(int attempt) {
        return baseDelay.multipliedBy(1L << Math.min(attempt, 10));
    }
}
""",
    """const reducer = (state = initialState, action) => {
  switch (action.type) {
    case "todos/add":
      return { ...state, todos: [...state.todos, action.payload] };
    case "todos/toggle":
      return {
        ...state,
        todos: state.todos.map((t) => (t.id === action.id ? { ...t, done: !t.done } : t)),
      };
    default:
      return state;
  }
};
""",
]

SYMBOL_LINES = [
    "Let ε > 0 and δ = ε/2; then |f(x) − f(y)| ≤ ∑ᵢ |aᵢ| · |x − y| < ε for all x, y ∈ ℝ.",
    "∀ n ∈ ℕ: ∫₀¹ xⁿ dx = 1/(n+1) → 0 as n → ∞, so the limit is ≈ 0 (±10⁻⁶).",
    "Status: ✔ build · ✔ tests · ✖ deploy — see → logs ↓ below • retry ⟳",
    "┌──────────┬────────┐\n│ region   │ p95 ms │\n├──────────┼────────┤\n│ eu-west  │   112  │\n└──────────┴────────┘",
    "Temperature: 21 °C ± 0.5 °C, humidity 45 %, pressure 1013 hPa — “comfortable” … mostly.",
]

LATEX_LINES = [
    r"The solution is $x = \frac{-b \pm \sqrt{b^2 - 4ac}}{2a}$, which is real when $b^2 \geq 4ac$.",
    r"$$\int_0^{\infty} e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2}, \qquad \sum_{n=1}^{\infty} \frac{1}{n^2} = \frac{\pi^2}{6}$$",
    r"Let $\mathbf{A} \in \mathbb{R}^{n \times n}$ with $\det(\mathbf{A}) \neq 0$; then $\mathbf{A}^{-1} = \frac{1}{\det \mathbf{A}} \operatorname{adj}(\mathbf{A})$.",
    r"\begin{align} f'(x) &= \lim_{h \to 0} \frac{f(x+h) - f(x)}{h} \\ &= 3x^2 + 2x \end{align}",
    r"By Bayes' rule, $P(A \mid B) = \frac{P(B \mid A)\,P(A)}{P(B)}$ where $P(B) > 0$.",
]

REGEX_LINES = [
    r"""EMAIL = re.compile(r"^[\w.+-]+@[\w-]+(\.[\w-]+)*\.[a-z]{2,}$", re.I)""",
    r"""sed -E 's/^([0-9]{4})-([0-9]{2})-([0-9]{2})$/\3.\2.\1/g' dates.txt | awk -F'|' '{print $2}'""",
    r"""const re = /(?<=\$)\d{1,3}(?:,\d{3})*(?:\.\d{2})?(?!\d)/gu;""",
    r"""grep -rnE '(TODO|FIXME|XXX)[:!]?\s*\(?[a-z]+\)?' --include='*.{py,js,ts}' .""",
    r"""perl -pe 's/(?<!\\)"(.*?)(?<!\\)"/«$1»/g; s/\s{2,}/ /g' < in.txt > out.txt""",
    r"""[[ "$x" =~ ^[+-]?[0-9]+([.][0-9]+)?$ ]] && echo "$((x * 2))" || echo "not a number: ${x:-<empty>}" >&2""",
]

_IDENTIFIER_WORDS = (
    "user account order item cache index token buffer stream request response config "
    "handler parser result value count total limit offset page session record node edge "
    "graph tree queue worker task job event message summary window budget retry"
).split()

# Texts made of (nearly) one character class only. The fit must not
# under-estimate them either, so no class gets a weight that only works
# when it is diluted in other text.
PROBES = {
    "emoji": "😀😂🤣😍🥳😭👍👏🙏🔥✨🎉🚀💖😴🤔👀💯🙌😅" * 3,
    "emoji_zwj": "👨\u200d👩\u200d👧\u200d👦 🏃\u200d♀️ 🙋\u200d♂️ 👋🏽 🇯🇵 🇫🇷 🇧🇷 ❤️ ☕️ ✅ ✔️ ⚠️" * 3,
    "math": "∀ε∃δ: |x−y|<δ ⇒ |f(x)−f(y)|<ε; ∑∏∫∮∂∇√∞≈≠≡≤≥⊂⊃∈∉∩∪∧∨¬⊕⊗→←↔⇐⇔" * 2,
    "box": "┌──┬──┐\n│ab│cd│\n├──┼──┤\n│ef│gh│\n└──┴──┘\n" * 4,
    "caps": "WARNING: DO NOT EDIT THIS FILE. IT IS GENERATED AUTOMATICALLY BY THE BUILD SCRIPT.",
    "digits": "4929 1234 5678 9012, +1 (415) 555-0132, 3.14159265358979323846, 1e-09, 0xDEADBEEF",
    "hiragana": "これはひらがなだけでかいたぶんしょうです。よみにくいですが、ときどきみかけます。",
    "katakana": "コンピュータ・プログラミング・インターフェース・データベース・サーバー・クラウド",
    "hangul": "데이터베이스연결이끊어졌습니다다시시도하십시오",
    "hanzi": "人工智能技术正在改变世界各行各业的发展方式与格局",
    "cyrillic": "Достопримечательности Санкт-Петербурга привлекают путешественников",
    "greek": "Ευχαριστούμε πολύ για την άμεση απάντησή σας",
    "arabic": "الذكاء الاصطناعي يغير طريقة عملنا",
    "devanagari": "कृत्रिम बुद्धिमत्ता दुनिया को बदल रही है",
    "number_lines": "\n".join(str(i * 7 % 1000) for i in range(1, 120)),
    "word_lines": "\n".join(("apple", "banana", "cherry", "delta", "echo", "fig", "grape")[i % 7] for i in range(100)),
}

# ---------------------------------------------------------------------------
# Generators
# ---------------------------------------------------------------------------


def _ident(rng: random.Random, style: str = "snake") -> str:
    words = rng.sample(_IDENTIFIER_WORDS, rng.randint(1, 3))
    if style == "camel":
        return words[0] + "".join(w.title() for w in words[1:])
    return "_".join(words)


def _gen_python_function(rng: random.Random) -> str:
    name = _ident(rng)
    args = [_ident(rng) for _ in range(rng.randint(0, 3))]
    body = []
    for _ in range(rng.randint(2, 7)):
        a, b = _ident(rng), _ident(rng)
        body.append(
            rng.choice(
                [
                    f"    {a} = {b}.get({json.dumps(rng.choice(_IDENTIFIER_WORDS))}, {rng.randint(0, 999)})",
                    f"    if {a} is None:\n        raise KeyError({json.dumps(a)})",
                    f"    for {a} in {b}:\n        {_ident(rng)}.append({a} * {rng.randint(2, 9)})",
                    f"    {a} += len({b}) // {rng.randint(2, 16)}",
                    f'    log.debug("{a}=%s {b}=%s", {a}, {b})',
                ]
            )
        )
    body.append(f"    return {_ident(rng)}")
    return f"def {name}({', '.join(args)}):\n" + "\n".join(body) + "\n"


def _gen_js_function(rng: random.Random) -> str:
    name = _ident(rng, "camel")
    args = [_ident(rng, "camel") for _ in range(rng.randint(0, 3))]
    lines = [f"export function {name}({', '.join(args)}) {{"]
    for _ in range(rng.randint(2, 6)):
        a, b = _ident(rng, "camel"), _ident(rng, "camel")
        lines.append(
            rng.choice(
                [
                    f"  const {a} = {b}?.{_ident(rng, 'camel')} ?? {rng.randint(0, 99)};",
                    f"  if (!{a}) return null;",
                    f"  {a}.forEach((x) => {b}.push(x + {rng.randint(1, 9)}));",
                    f"  console.log(`{a}: ${{{a}}}`);",
                ]
            )
        )
    lines.append(f"  return {_ident(rng, 'camel')};\n}}\n")
    return "\n".join(lines)


def _json_value(rng: random.Random, depth: int):
    kind = rng.random()
    if depth > 2 or kind < 0.35:
        return rng.choice(
            [
                rng.randint(-5, 100_000),
                round(rng.uniform(-1000, 1000), rng.randint(1, 6)),
                rng.choice([True, False, None]),
                rng.choice(ENGLISH)[: rng.randint(5, 60)],
                rng.choice(_IDENTIFIER_WORDS) + "-" + "".join(rng.choices(string.hexdigits.lower(), k=8)),
                f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
                rng.choice(CHINESE + JAPANESE + KOREAN)[: rng.randint(4, 30)] if rng.random() < 0.15 else "ok",
            ]
        )
    if kind < 0.7:
        return {_ident(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 6))}
    return [_json_value(rng, depth + 1) for _ in range(rng.randint(1, 5))]


def _gen_json(rng: random.Random) -> str:
    value = {_ident(rng): _json_value(rng, 0) for _ in range(rng.randint(1, 8))}
    style = rng.random()
    if style < 0.4:
        return json.dumps(value, ensure_ascii=False)
    if style < 0.8:
        return json.dumps(value, ensure_ascii=False, indent=2)
    return json.dumps(value)  # \u-escaped non-ASCII, as many APIs send it


def _gen_log(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(3, 20)):
        level = rng.choice(["INFO", "INFO", "DEBUG", "WARNING", "ERROR"])
        ts = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d},{rng.randint(0, 999):03d}"
        module = rng.choice(["uvicorn.access", "app.worker", "sqlalchemy.engine", "httpx", "scheduler"])
        msg = rng.choice(
            [
                f'{rng.randint(10, 250)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}:{rng.randint(1024, 65535)} - "GET /api/v1/chats/{rng.randint(1, 99999)} HTTP/1.1" {rng.choice([200, 200, 204, 404, 500])}',
                f"task {_ident(rng)} finished in {rng.uniform(0.001, 30):.3f}s (retries={rng.randint(0, 5)})",
                f"connection pool size={rng.randint(1, 64)} overflow={rng.randint(0, 10)} checked_out={rng.randint(0, 64)}",
                f'HTTP Request: POST https://api.example.com/v1/{_ident(rng)} "HTTP/1.1 {rng.choice([200, 429, 502])}"',
                f"Traceback (most recent call last):\n  File \"/app/{_ident(rng)}.py\", line {rng.randint(1, 900)}, in {_ident(rng)}\n    {_ident(rng)}({_ident(rng)})\nKeyError: '{_ident(rng)}'",
            ]
        )
        lines.append(f"{ts} {level:<7} [{module}] {msg}")
    return "\n".join(lines) + "\n"


def _gen_table(rng: random.Random) -> str:
    cols = rng.sample(
        ["id", "name", "status", "cpu", "mem_mb", "latency_ms", "count", "updated", "owner"], rng.randint(3, 6)
    )
    rows = []
    for _ in range(rng.randint(2, 15)):
        row = []
        for c in cols:
            if c in ("cpu", "latency_ms"):
                row.append(f"{rng.uniform(0, 100):.2f}")
            elif c in ("id", "count", "mem_mb"):
                row.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
            elif c == "updated":
                row.append(f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
            else:
                row.append(_ident(rng))
        rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    style = rng.random()
    if style < 0.4:  # Markdown
        out = [
            "| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |",
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        ]
        out += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in rows]
    elif style < 0.7:  # aligned, like psql or ps
        out = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths))]
        out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    else:  # CSV
        out = [",".join(cols)] + [",".join(r) for r in rows]
    return "\n".join(out) + "\n"


def _gen_listing(rng: random.Random) -> str:
    lines = [f"total {rng.randint(8, 4000)}"]
    for _ in range(rng.randint(3, 15)):
        lines.append(
            f"{rng.choice(['-rw-r--r--', 'drwxr-xr-x', '-rwxr-xr-x'])} {rng.randint(1, 9)} root root "
            f"{rng.randint(0, 9_999_999):>8} {rng.choice(['Jan', 'Feb', 'Mar', 'Oct', 'Nov'])} {rng.randint(1, 28):>2} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {_ident(rng)}{rng.choice(['.py', '.json', '.log', '', '.tar.gz'])}"
        )
    return "\n".join(lines) + "\n"


def _gen_blob(rng: random.Random) -> str:
    """Opaque strings tools return: base64 payloads, digests, ids, URLs."""
    kind = rng.random()
    if kind < 0.35:
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(20, 1500)))
        data = base64.b64encode(raw).decode()
        if rng.random() < 0.5:
            return json.dumps({"name": _ident(rng) + ".bin", "encoding": "base64", "data": data}) + "\n"
        return "\n".join(data[i : i + 76] for i in range(0, len(data), 76)) + "\n"
    if kind < 0.55:
        return "".join(
            f"{hashlib.sha256(str(rng.random()).encode()).hexdigest()}  {_ident(rng)}.tar.gz\n"
            for _ in range(rng.randint(2, 12))
        )
    if kind < 0.75:
        return json.dumps({"ids": [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(rng.randint(2, 20))]}) + "\n"
    return "".join(
        f"https://{rng.choice(['api.example.com', 'cdn.example.org', 'github.com'])}/{_ident(rng)}/"
        f"{rng.randint(1, 10**6)}?page={rng.randint(1, 50)}&sort={rng.choice(['asc', 'desc'])}&token="
        f"{''.join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(8, 32)))}\n"
        for _ in range(rng.randint(2, 10))
    )


def _gen_minified(rng: random.Random) -> str:
    """Minified JavaScript, as a bundle or a web page would return it:
    one-letter names, no spaces that can go."""
    parts = []
    for _ in range(rng.randint(2, 12)):
        a, b, c = (rng.choice(string.ascii_letters) for _ in range(3))
        n = rng.randint(0, 999)
        parts.append(
            rng.choice(
                [
                    f"function {a}({b},{c}){{return {b}.map(function(x){{return x*{c}+{n}}})}}",
                    f"var {a}=[{n},{rng.randint(0, 99)},{rng.randint(0, 9)}],{b}={{{c}:{n},t:!0}};",
                    f'if(!{a}||{a}.length<{n})throw new Error("{_ident(rng)}");',
                    f"{a}.prototype.{_ident(rng, 'camel')}=function({b}){{this.{c}={b}||{{}};return this}};",
                    f"for(var {a}=0;{a}<{b}.length;{a}++){c}+={b}[{a}]<<{rng.randint(1, 8)};",
                    f'!function(){{"use strict";var {a}=window.{_ident(rng, "camel")}||{{}};{a}.v="{rng.randint(1, 9)}.{n}"}}();',
                ]
            )
        )
    return "".join(parts)


def _gen_test_output(rng: random.Random) -> str:
    lines = [
        "============================= test session starts ==============================",
        f"platform linux -- Python 3.11.{rng.randint(0, 9)}, pytest-8.{rng.randint(0, 3)}.0",
        f"collected {rng.randint(5, 400)} items",
        "",
    ]
    for _ in range(rng.randint(2, 8)):
        marks = "".join(rng.choice("....F.s") for _ in range(rng.randint(5, 60)))
        lines.append(f"tests/test_{_ident(rng)}.py {marks} [{rng.randint(1, 100):>3}%]")
    lines.append(
        f"FAILED tests/test_{_ident(rng)}.py::test_{_ident(rng)} - AssertionError: assert {rng.randint(0, 99)} == {rng.randint(0, 99)}"
    )
    lines.append(f"==== {rng.randint(0, 5)} failed, {rng.randint(5, 400)} passed in {rng.uniform(0.5, 90):.2f}s ====")
    return "\n".join(lines) + "\n"


def _pieces(category: str) -> Callable[[random.Random], str]:
    """A function drawing the next piece of text of a category."""
    if category == "english":

        def english(rng: random.Random) -> str:
            sentence = rng.choice(ENGLISH)
            if rng.random() < 0.04:  # a heading or a shout
                sentence = sentence.upper()
            return sentence + (" " if rng.random() < 0.8 else "\n\n")

        return english
    if category in ("chinese", "japanese", "korean"):
        seed = {"chinese": CHINESE, "japanese": JAPANESE, "korean": KOREAN}[category]
        sep = " " if category == "korean" else ""
        return lambda rng: rng.choice(seed) + (sep if rng.random() < 0.85 else "\n\n")
    if category == "code":
        return lambda rng: (
            rng.choice(
                [
                    lambda: rng.choice(CODE_SNIPPETS),
                    lambda: _gen_python_function(rng),
                    lambda: _gen_js_function(rng),
                    lambda: _gen_minified(rng),
                    lambda: rng.choice(REGEX_LINES),
                ]
            )()
            + "\n"
        )
    if category == "json":
        return lambda rng: _gen_json(rng) + "\n"
    if category == "tool_output":
        return lambda rng: rng.choice([_gen_log, _gen_table, _gen_listing, _gen_test_output, _gen_blob])(rng)
    if category == "mixed":

        def mixed(rng: random.Random) -> str:
            pick = rng.random()
            if pick < 0.35:
                return rng.choice(CHINESE + JAPANESE + KOREAN)
            if pick < 0.65:
                return rng.choice(ENGLISH) + " "
            if pick < 0.75:
                return "\n```python\n" + _gen_python_function(rng) + "```\n"
            if pick < 0.8:
                return rng.choice(SYMBOL_LINES) + "\n"
            if pick < 0.85:
                return rng.choice(LATEX_LINES) + "\n"
            return "\n" + _gen_json(rng) + "\n"

        return mixed
    raise KeyError(category)


def make_text(category: str, length: int, rng: random.Random) -> str:
    """About ``length`` characters of one category (cut at ``length``)."""
    if category == "other_languages":  # one language per sample, as per message
        language = OTHER_LANGUAGES[rng.choice(sorted(OTHER_LANGUAGES))]
        piece = lambda rng: rng.choice(language) + (" " if rng.random() < 0.85 else "\n\n")  # noqa: E731
    else:
        piece = _pieces(category)
    parts, size = [], 0
    while size < length:
        part = piece(rng)
        parts.append(part)
        size += len(part)
    text = "".join(parts)
    if len(text) > length:
        text = text[:length]
    return text


def _lengths(rng: random.Random, count: int) -> list:
    lo, hi = math.log(MIN_CHARS), math.log(MAX_CHARS)
    # Evenly spread over the log range, then jittered, so every size class is covered.
    return [int(math.exp(lo + (hi - lo) * (i + rng.random()) / count)) for i in range(count)]


@lru_cache(maxsize=8)
def samples(category: str, count: int = 300, seed: int = 5) -> tuple:
    """``count`` samples of one category, lengths from 10 to 20,000 chars."""
    rng = random.Random(f"{category}:{seed}")
    return tuple(make_text(category, n, rng) for n in _lengths(rng, count))


def seed_texts() -> list:
    """Every hand-written sentence, snippet and line on its own (the
    building blocks of the samples), and the one-class probes."""
    out = ENGLISH + [s.upper() for s in ENGLISH[:5]] + CHINESE + JAPANESE + KOREAN
    out += CODE_SNIPPETS + REGEX_LINES + LATEX_LINES + SYMBOL_LINES + list(PROBES.values())
    for sentences in OTHER_LANGUAGES.values():
        out += sentences
    return out


def corpus(per_category: int = 300, seed: int = 5, categories=CATEGORIES) -> dict:
    return {c: list(samples(c, per_category, seed)) for c in categories}


if __name__ == "__main__":  # a quick look at the corpus
    for name, texts in corpus().items():
        sizes = sorted(len(t) for t in texts)
        print(f"{name:12} {len(texts):4} samples, {sizes[0]}..{sizes[-1]} chars, total {sum(sizes):,}")
        print("   ", repr(texts[len(texts) // 2][:100]))
